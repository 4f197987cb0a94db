//! Build script: with feature `ofi`, compiles the thin C layer over libfabric's inline API
//! (`csrc/ofi_shim.c`) and links libfabric. Nothing happens without the feature.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "ofi")]
    {
        println!("cargo:rerun-if-changed=csrc/ofi_shim.c");
        cc::Build::new()
            .file("csrc/ofi_shim.c")
            .warnings(true)
            .compile("pccl_ofi_shim");
        println!("cargo:rustc-link-lib=fabric");
    }
}
