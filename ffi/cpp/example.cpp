// PCCL from C++: N in-process ranks (std::thread), each with a communicator, run the
// collectives of a sharded training step: all-gather the parameter shards, reduce-scatter
// the gradients with AVG, all-reduce a scalar, and a non-blocking all-reduce overlapped with
// other work.
//
// Build (after `cargo build --release`):
//   c++ -std=c++17 -I include ffi/cpp/example.cpp -o example
//       -L target/release -lpccl -lpthread -Wl,-rpath,target/release
// or, after scripts/install.sh:  c++ -std=c++17 example.cpp $(pkg-config --cflags --libs pccl)
// Run:    ./example 4          (PCCL_RANKS_PER_NODE=2 ./example 4 pretends 2 nodes of 2)

#include "pccl.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// Turns a failed PCCL call into an exception carrying the library's message.
void check(pcclResult_t rc, pcclComm_t comm, const char* what) {
    if (rc != pcclSuccess)
        throw std::runtime_error(std::string(what) + ": " + pcclGetErrorString(rc) + ": " +
                                 pcclGetLastError(comm));
}

// Owns a communicator (RAII).
class Comm {
  public:
    Comm(pcclThreadWorld_t world, int rank) {
        check(pcclCommInitThreads(&comm_, world, rank), nullptr, "pcclCommInitThreads");
    }
    ~Comm() { pcclCommDestroy(comm_); }
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;
    pcclComm_t get() const { return comm_; }
    int rank() const {
        int r = -1;
        check(pcclCommUserRank(comm_, &r), comm_, "pcclCommUserRank");
        return r;
    }
    int size() const {
        int n = -1;
        check(pcclCommCount(comm_, &n), comm_, "pcclCommCount");
        return n;
    }

  private:
    pcclComm_t comm_ = nullptr;
};

// One rank's training step; returns an empty string or what went wrong.
std::string step(pcclThreadWorld_t world, int rank) {
    try {
        Comm comm(world, rank);
        const int p = comm.size();
        const size_t shard = 1000;

        // All-gather: every rank holds one shard of the parameters.
        std::vector<float> params(shard * p);
        for (size_t i = 0; i < shard; i++) params[rank * shard + i] = float(rank);
        check(pcclAllGather(params.data() + rank * shard, params.data(), shard, pcclFloat32,
                            comm.get(), nullptr),
              comm.get(), "pcclAllGather");
        for (int r = 0; r < p; r++)
            if (params[r * shard] != float(r)) return "all-gather gave a wrong shard";

        // Reduce-scatter of the gradients with AVG: each rank keeps the mean of its shard.
        std::vector<float> grads(shard * p, float(rank + 1));
        std::vector<float> mine(shard);
        check(pcclReduceScatter(grads.data(), mine.data(), shard, pcclFloat32, pcclAvg,
                                comm.get(), nullptr),
              comm.get(), "pcclReduceScatter");
        if (mine[0] != float(p + 1) / 2) return "reduce-scatter avg is wrong";

        // A non-blocking all-reduce of the loss, overlapped with other work.
        double loss = 0.5 * (rank + 1);
        pcclRequest_t req = nullptr;
        check(pcclIallReduce(&loss, &loss, 1, pcclFloat64, pcclSum, comm.get(), &req),
              comm.get(), "pcclIallReduce");
        int done = 0;
        while (!done) check(pcclTest(req, &done), comm.get(), "pcclTest");
        check(pcclWait(req), comm.get(), "pcclWait");
        if (loss != 0.25 * p * (p + 1)) return "all-reduce of the loss is wrong";

        // Bad input comes back as a code with a message, never as a crash.
        pcclResult_t rc = pcclAllReduce(&loss, &loss, 1, pcclFloat64, 42, comm.get(), nullptr);
        if (rc != pcclInvalidArgument) return "an unknown op was accepted";

        check(pcclBarrier(comm.get()), comm.get(), "pcclBarrier");
        return {};
    } catch (const std::exception& e) {
        return e.what();
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int p = argc > 1 ? std::atoi(argv[1]) : 4;
    int version = 0;
    pcclGetVersion(&version);
    pcclThreadWorld_t world = nullptr;
    if (pcclThreadWorldCreate(p, &world) != pcclSuccess) {
        std::fprintf(stderr, "pcclThreadWorldCreate: %s\n", pcclGetLastError(nullptr));
        return 1;
    }
    std::vector<std::string> errors(p);
    std::vector<std::thread> ranks;
    for (int r = 0; r < p; r++) ranks.emplace_back([&, r] { errors[r] = step(world, r); });
    for (auto& t : ranks) t.join();
    pcclThreadWorldDestroy(world);
    int failed = 0;
    for (int r = 0; r < p; r++)
        if (!errors[r].empty()) {
            std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
            failed++;
        }
    std::printf("PCCL %d.%d.%d, %d ranks: %s\n", version / 10000, version / 100 % 100,
                version % 100, p, failed ? "FAILED" : "ok");
    return failed ? 1 : 0;
}
