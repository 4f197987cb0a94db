/* A thin C layer over libfabric for PCCL's `ofi` transport (feature `ofi`).
 *
 * Most of libfabric's data-path API is `static inline` (calls through ops tables), which Rust
 * cannot link to: these functions only forward to it, and translate the few structures PCCL
 * reads into flat ones whose layout the Rust side declares (src/transport/ofi/sys.rs). No
 * policy lives here. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What PCCL reads of a chosen `fi_info`. */
struct pccl_ofi_desc {
	uint64_t caps;
	uint64_t mode;
	uint64_t mr_mode;
	uint64_t cq_data_size;
	uint64_t max_msg_size;
	uint64_t tx_size;
	uint64_t rx_size;
	char provider[64];
	char fabric[128];
	char domain[128];
};

/* The objects of one endpoint. */
struct pccl_ofi_ep {
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
};

/* One completion, successful (err == 0) or not. */
struct pccl_ofi_comp {
	void *ctx;
	uint64_t flags;
	uint64_t len;
	uint64_t data;
	uint64_t tag;
	uint64_t olen;
	int32_t err;
	int32_t prov_errno;
};

static void copy_str(char *dst, size_t cap, const char *src)
{
	if (!src)
		src = "";
	strncpy(dst, src, cap - 1);
	dst[cap - 1] = 0;
}

int pccl_ofi_getinfo(const char *prov, const char *domain, int hmem,
		     struct fi_info **out)
{
	struct fi_info *hints = fi_allocinfo();
	int ret;
	if (!hints)
		return -FI_ENOMEM;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_TAGGED | FI_SEND | FI_RECV | FI_DIRECTED_RECV;
	if (hmem)
		hints->caps |= FI_HMEM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR |
				      FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	if (hmem)
		hints->domain_attr->mr_mode |= FI_MR_HMEM;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	hints->tx_attr->msg_order = FI_ORDER_SAS;
	hints->rx_attr->msg_order = FI_ORDER_SAS;
	if (prov && *prov)
		hints->fabric_attr->prov_name = strdup(prov);
	if (domain && *domain)
		hints->domain_attr->name = strdup(domain);
	ret = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, out);
	fi_freeinfo(hints);
	return ret;
}

void pccl_ofi_freeinfo(struct fi_info *info)
{
	fi_freeinfo(info);
}

/* Describes `info` (the first entry of a list), or returns its successor when `next`. */
struct fi_info *pccl_ofi_describe(struct fi_info *info, struct pccl_ofi_desc *d)
{
	memset(d, 0, sizeof(*d));
	d->caps = info->caps;
	d->mode = info->mode;
	d->mr_mode = (uint64_t)info->domain_attr->mr_mode;
	d->cq_data_size = info->domain_attr->cq_data_size;
	d->max_msg_size = info->ep_attr->max_msg_size;
	d->tx_size = info->tx_attr->size;
	d->rx_size = info->rx_attr->size;
	copy_str(d->provider, sizeof(d->provider), info->fabric_attr->prov_name);
	copy_str(d->fabric, sizeof(d->fabric), info->fabric_attr->name);
	copy_str(d->domain, sizeof(d->domain), info->domain_attr->name);
	return info->next;
}

/* Closes the endpoint only (registrations must be closed before the domain). */
void pccl_ofi_close_ep(struct pccl_ofi_ep *e)
{
	if (e->ep)
		fi_close(&e->ep->fid);
	e->ep = NULL;
}

void pccl_ofi_close(struct pccl_ofi_ep *e)
{
	if (e->ep)
		fi_close(&e->ep->fid);
	if (e->av)
		fi_close(&e->av->fid);
	if (e->cq)
		fi_close(&e->cq->fid);
	if (e->domain)
		fi_close(&e->domain->fid);
	if (e->fabric)
		fi_close(&e->fabric->fid);
	memset(e, 0, sizeof(*e));
}

/* Opens fabric, domain, completion queue, address vector and endpoint of `info` (one entry,
 * not a list); on failure everything opened is closed again. With `want_fd` the completion
 * queue gets a file-descriptor wait object where the provider has one (else none). */
int pccl_ofi_open(struct fi_info *info, struct pccl_ofi_ep *e, int want_fd)
{
	struct fi_cq_attr cq_attr;
	struct fi_av_attr av_attr;
	int ret;
	memset(e, 0, sizeof(*e));
	memset(&cq_attr, 0, sizeof(cq_attr));
	memset(&av_attr, 0, sizeof(av_attr));
	ret = fi_fabric(info->fabric_attr, &e->fabric, NULL);
	if (ret)
		goto fail;
	ret = fi_domain(e->fabric, info, &e->domain, NULL);
	if (ret)
		goto fail;
	cq_attr.format = FI_CQ_FORMAT_TAGGED;
	cq_attr.wait_obj = want_fd ? FI_WAIT_FD : FI_WAIT_NONE;
	cq_attr.size = 0;
	ret = fi_cq_open(e->domain, &cq_attr, &e->cq, NULL);
	if (ret && want_fd) {
		cq_attr.wait_obj = FI_WAIT_NONE;
		ret = fi_cq_open(e->domain, &cq_attr, &e->cq, NULL);
	}
	if (ret)
		goto fail;
	av_attr.type = FI_AV_TABLE;
	ret = fi_av_open(e->domain, &av_attr, &e->av, NULL);
	if (ret)
		goto fail;
	ret = fi_endpoint(e->domain, info, &e->ep, NULL);
	if (ret)
		goto fail;
	ret = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		goto fail;
	ret = fi_ep_bind(e->ep, &e->av->fid, 0);
	if (ret)
		goto fail;
	ret = fi_enable(e->ep);
	if (ret)
		goto fail;
	return 0;
fail:
	pccl_ofi_close(e);
	return ret;
}

/* The completion queue's file descriptor (FI_GETWAIT), or -1 where it has none. */
int pccl_ofi_wait_fd(struct pccl_ofi_ep *e)
{
	int fd = -1;
	if (!e->cq || fi_control(&e->cq->fid, FI_GETWAIT, &fd) != 0)
		return -1;
	return fd;
}

/* 0 when the caller may block on the wait fd (nothing to progress), else -FI_EAGAIN. */
int pccl_ofi_trywait(struct pccl_ofi_ep *e)
{
	struct fid *f = &e->cq->fid;
	return fi_trywait(e->fabric, &f, 1);
}

/* Blocks until `fd` is readable or `timeout_ms` passes (touches no libfabric object); poll's
 * result (0: timed out). */
int pccl_ofi_block(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, timeout_ms);
}

int pccl_ofi_getname(struct pccl_ofi_ep *e, void *addr, size_t *len)
{
	return fi_getname(&e->ep->fid, addr, len);
}

/* Inserts `count` addresses (each `stride` bytes apart); returns how many were inserted. */
int pccl_ofi_av_insert(struct pccl_ofi_ep *e, const void *addrs, size_t count,
		       fi_addr_t *out)
{
	return fi_av_insert(e->av, addrs, count, out, 0, NULL);
}

ssize_t pccl_ofi_tsend(struct pccl_ofi_ep *e, const void *buf, size_t len, void *desc,
		       fi_addr_t dest, uint64_t tag, int with_data, uint64_t data,
		       void *ctx)
{
	if (with_data)
		return fi_tsenddata(e->ep, buf, len, desc, data, dest, tag, ctx);
	return fi_tsend(e->ep, buf, len, desc, dest, tag, ctx);
}

ssize_t pccl_ofi_trecv(struct pccl_ofi_ep *e, void *buf, size_t len, void *desc,
		       fi_addr_t src, uint64_t tag, uint64_t ignore, void *ctx)
{
	return fi_trecv(e->ep, buf, len, desc, src, tag, ignore, ctx);
}

int pccl_ofi_cancel(struct pccl_ofi_ep *e, void *ctx)
{
	return (int)fi_cancel(&e->ep->fid, ctx);
}

/* Reads up to `count` completions into `out`: returns how many, 0 when none, or a negative
 * error. A failed operation comes back as one entry with `err` set (and the provider's
 * description in `msg`, `msg_cap` bytes). */
ssize_t pccl_ofi_poll(struct pccl_ofi_ep *e, struct pccl_ofi_comp *out, size_t count,
		      char *msg, size_t msg_cap)
{
	struct fi_cq_tagged_entry ent[64];
	struct fi_cq_err_entry err;
	ssize_t n, i;
	if (count > 64)
		count = 64;
	n = fi_cq_read(e->cq, ent, count);
	if (n == -FI_EAGAIN)
		return 0;
	if (n == -FI_EAVAIL) {
		memset(&err, 0, sizeof(err));
		n = fi_cq_readerr(e->cq, &err, 0);
		if (n == -FI_EAGAIN)
			return 0;
		if (n < 0)
			return n;
		memset(out, 0, sizeof(*out));
		out->ctx = err.op_context;
		out->flags = err.flags;
		out->len = err.len;
		out->data = err.data;
		out->tag = err.tag;
		out->olen = err.olen;
		/* Some providers (shm) report negative codes. */
		out->err = err.err < 0 ? -err.err : (err.err ? err.err : FI_EOTHER);
		out->prov_errno = err.prov_errno;
		if (msg && msg_cap) {
			const char *s = fi_cq_strerror(e->cq, err.prov_errno, err.err_data,
						       NULL, 0);
			copy_str(msg, msg_cap, s);
		}
		return 1;
	}
	if (n < 0)
		return n;
	for (i = 0; i < n; i++) {
		memset(&out[i], 0, sizeof(out[i]));
		out[i].ctx = ent[i].op_context;
		out[i].flags = ent[i].flags;
		out[i].len = ent[i].len;
		out[i].data = ent[i].data;
		out[i].tag = ent[i].tag;
	}
	return n;
}

int pccl_ofi_mr_reg(struct pccl_ofi_ep *e, const void *buf, size_t len, uint64_t key,
		    struct fid_mr **mr, void **desc)
{
	int ret = fi_mr_reg(e->domain, buf, len, FI_SEND | FI_RECV, 0, key, 0, mr, NULL);
	if (ret)
		return ret;
	*desc = fi_mr_desc(*mr);
	return 0;
}

/* Registers `len` bytes at `buf` of memory interface `iface` (an `enum fi_hmem_iface`:
 * FI_HMEM_SYSTEM, FI_HMEM_CUDA, FI_HMEM_ROCR) on device ordinal `device` (CUDA and ROCr
 * use the same union slot). libfabric answers -FI_ENOSYS where its build lacks the iface. */
int pccl_ofi_mr_regattr(struct pccl_ofi_ep *e, const void *buf, size_t len, int iface,
			int device, uint64_t key, struct fid_mr **mr, void **desc)
{
	struct iovec iov = { (void *)buf, len };
	struct fi_mr_attr attr;
	int ret;
	memset(&attr, 0, sizeof(attr));
	attr.mr_iov = &iov;
	attr.iov_count = 1;
	attr.access = FI_SEND | FI_RECV;
	attr.requested_key = key;
	attr.iface = (enum fi_hmem_iface)iface;
	if (iface == FI_HMEM_CUDA)
		attr.device.cuda = device;
	else
		attr.device.reserved = (uint64_t)device;
	ret = fi_mr_regattr(e->domain, &attr, 0, mr);
	if (ret)
		return ret;
	*desc = fi_mr_desc(*mr);
	return 0;
}

int pccl_ofi_mr_close(struct fid_mr *mr)
{
	return fi_close(&mr->fid);
}

uint64_t pccl_ofi_flag(int which)
{
	switch (which) {
	case 0: return FI_HMEM;
	case 1: return FI_MR_LOCAL;
	case 2: return FI_LOCAL_MR;
	case 3: return FI_REMOTE_CQ_DATA;
	case 4: return (uint64_t)FI_ADDR_UNSPEC;
	case 5: return FI_HMEM_SYSTEM;
	case 6: return FI_HMEM_CUDA;
	case 7: return FI_HMEM_ROCR;
	case 8: return FI_ENOSYS;
	case 9: return FI_EOPNOTSUPP;
	default: return 0;
	}
}
