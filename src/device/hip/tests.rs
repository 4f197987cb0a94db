use super::*;
use crate::error::ErrorKind;
use std::ffi::OsStr;
use std::ffi::OsString;

#[test]
fn arch_parsing() {
    assert_eq!(parse_arch("gfx90a").unwrap(), "gfx90a");
    assert_eq!(
        parse_arch("gfx90a:sramecc+:xnack-\0\0").unwrap(),
        "gfx90a:sramecc+:xnack-"
    );
    assert_eq!(parse_arch(" gfx1100 ").unwrap(), "gfx1100");
    assert_eq!(parse_arch("gfx942:xnack+").unwrap(), "gfx942:xnack+");
    assert_eq!(parse_arch("gfx9-4-generic").unwrap(), "gfx9-4-generic");
    for bad in [
        "",
        "gfx",
        "sm_90",
        "gfxabc",
        "gfx90a:xnack",
        "gfx90a:+",
        "gfx90a;rm -rf",
        "gfx90a:sramecc+:xnack-:",
        "GFX90A",
    ] {
        let e = parse_arch(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}");
    }
}

#[test]
fn options() {
    let o = compile_options("gfx90a:sramecc+:xnack-").unwrap();
    assert_eq!(o[0], "--offload-arch=gfx90a:sramecc+:xnack-");
    assert!(o.contains(&format!("-DPCCL_UNROLL={UNROLL}")));
    assert!(o.contains(&"-ffp-contract=off".to_string()));
    assert!(compile_options("sm_90").is_err());
}

#[test]
fn sources_are_hip_ready() {
    let s = hip_source("reduce.cu", REDUCE_SOURCE);
    assert!(s.starts_with(HIP_PRELUDE));
    assert!(s.contains("#line 1 \"reduce.cu\"\n// PCCL device reductions"));
    // The PTX conversions have a __HIP__ alternative.
    let hip_branch = REDUCE_SOURCE.find("#if defined(__HIP__)").unwrap();
    let first_asm = REDUCE_SOURCE.find("asm(").unwrap();
    assert!(hip_branch < first_asm);
    assert!(!TRANSPOSE_SOURCE.contains("asm("));
    assert!(REDUCE_SOURCE.contains("pccl_reduce_##NAME##_##OPNAME"));
    for d in ["f16", "bf16", "f32", "f64"] {
        assert!(
            REDUCE_SOURCE.contains(&format!("void pccl_divide_{d}(")),
            "{d}"
        );
    }
    assert!(TRANSPOSE_SOURCE.contains("pccl_transpose_copy_##NAME"));
    assert!(TRANSPOSE_SOURCE.contains("pccl_transpose_tile_##NAME"));
}

#[test]
fn arch_from_property_bytes() {
    let mut props = vec![0u8; 1500];
    props[..19].copy_from_slice(b"AMD Instinct MI250X");
    props[1100..1122].copy_from_slice(b"gfx90a:sramecc+:xnack-");
    assert_eq!(
        find_arch_in_properties(&props).unwrap(),
        "gfx90a:sramecc+:xnack-"
    );
    let mut plain = vec![0u8; 600];
    plain[300..307].copy_from_slice(b"gfx1100");
    assert_eq!(find_arch_in_properties(&plain).unwrap(), "gfx1100");
    // Not at the start of a string, or not an architecture: ignored.
    let mut noise = vec![0u8; 64];
    noise[..9].copy_from_slice(b"xxgfx90a\0");
    noise[20..25].copy_from_slice(b"gfxzz");
    assert_eq!(find_arch_in_properties(&noise), None);
    let mut tail = vec![0u8; 16];
    tail[10..16].copy_from_slice(b"gfx942");
    assert_eq!(find_arch_in_properties(&tail).unwrap(), "gfx942");
}

#[test]
fn rccl_enums() {
    let dt: Vec<_> = DType::ALL.iter().map(|&d| rccl_dtype(d)).collect();
    // I8 U8 I32 U32 I64 U64 F16 BF16 F32 F64
    assert_eq!(dt, [0, 1, 2, 3, 4, 5, 6, 9, 7, 8]);
    let ops: Vec<_> = ReduceOp::ALL.iter().map(|&o| rccl_op(o)).collect();
    // Sum Prod Min Max Avg
    assert_eq!(ops, [0, 1, 3, 2, 4]);
    assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
}

#[test]
fn candidates() {
    let c = library_candidates(Some(OsStr::new("/x/libamdhip64.so")), &HIP_LIBRARY_NAMES);
    assert_eq!(c[0], OsString::from("/x/libamdhip64.so"));
    assert_eq!(c.len(), 4);
    assert_eq!(
        library_candidates(Some(OsStr::new("")), &RCCL_LIBRARY_NAMES),
        ["librccl.so", "librccl.so.1"]
    );
    assert_eq!(library_candidates(None, &HIPRTC_LIBRARY_NAMES).len(), 3);
}

#[test]
fn reduce_validation() {
    let f32s = |n: usize| n * 4;
    // Fine: three disjoint aligned buffers, in place too.
    let ok = plan_reduce(
        ReduceOp::Sum,
        DType::F32,
        100,
        (0x10000, f32s(100)),
        (0x20000, f32s(100)),
        (0x30000, f32s(128)),
    )
    .unwrap()
    .unwrap();
    assert_eq!((ok.n, ok.head), (100, 0));
    let in_place = plan_reduce(
        ReduceOp::Max,
        DType::F32,
        100,
        (0x10000, 400),
        (0x10000, 400),
        (0x20000, 400),
    )
    .unwrap();
    assert!(in_place.is_some());
    // Nothing to do.
    assert!(
        plan_reduce(ReduceOp::Sum, DType::I8, 0, (0, 0), (0, 0), (0, 0))
            .unwrap()
            .is_none()
    );
    // Short buffer.
    let e = plan_reduce(
        ReduceOp::Sum,
        DType::F32,
        100,
        (0x10000, 400),
        (0x20000, 396),
        (0x30000, 400),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("first input buffer holds 396"), "{e}");
    // Overflowing count.
    let e = plan_reduce(
        ReduceOp::Sum,
        DType::F64,
        usize::MAX / 4,
        (0, usize::MAX),
        (0, usize::MAX),
        (0, usize::MAX),
    )
    .unwrap_err();
    assert!(e.message().contains("overflow"), "{e}");
    // Misaligned.
    let e = plan_reduce(
        ReduceOp::Sum,
        DType::F32,
        4,
        (0x10002, 16),
        (0x20000, 16),
        (0x30000, 16),
    )
    .unwrap_err();
    assert!(e.message().contains("destination buffer at 0x10002"), "{e}");
    // Partial overlap.
    let e = plan_reduce(
        ReduceOp::Sum,
        DType::F32,
        100,
        (0x10000, 400),
        (0x10010, 400),
        (0x30000, 400),
    )
    .unwrap_err();
    assert!(e.message().contains("partly overlaps"), "{e}");
    // Avg on integers.
    assert!(plan_reduce(
        ReduceOp::Avg,
        DType::I32,
        1,
        (0x10000, 4),
        (0x20000, 4),
        (0x30000, 4)
    )
    .is_err());
    // Copy checks.
    assert!(check_same_len("upload", 8, 8).is_ok());
    assert!(check_same_len("upload", 8, 12).is_err());
    assert!(check_whole_elements(6, DType::I32).is_err());
    assert!(check_whole_elements(8, DType::I32).is_ok());
}

#[test]
fn transpose_validation() {
    let e =
        plan_transpose_spans((0x1000, 64), (0x9000, 64), usize::MAX / 2, 4, 2, 512).unwrap_err();
    assert!(e.message().contains("overflows"), "{e}");
    let e = plan_transpose_spans((0x1000, 255), (0x9000, 256), 4, 4, 16, 512).unwrap_err();
    assert!(e.message().contains("needs 256 bytes"), "{e}");
    let e = plan_transpose_spans((0x1000, 256), (0x10f0, 256), 4, 4, 16, 512).unwrap_err();
    assert!(e.message().contains("overlap"), "{e}");
    assert!(plan_transpose_spans((0, 0), (0, 0), 0, 7, 16, 512)
        .unwrap()
        .is_none());
    let (total, plan) = plan_transpose_spans((0x1000, 4096), (0x9000, 4096), 2, 8, 256, 512)
        .unwrap()
        .unwrap();
    assert_eq!(total, 4096);
    assert_eq!(plan.kernel().unwrap(), "pccl_transpose_copy_16");
    // Misaligned addresses fall back to narrower units, not to an error.
    let (_, plan) = plan_transpose_spans((0x1001, 4096), (0x9000, 4096), 2, 8, 256, 512)
        .unwrap()
        .unwrap();
    assert_eq!(plan.kernel().unwrap(), "pccl_transpose_copy_1");
    let (_, plan) = plan_transpose_spans((0x1004, 96), (0x9000, 96), 4, 6, 4, 256)
        .unwrap()
        .unwrap();
    assert_eq!(plan.kernel().unwrap(), "pccl_transpose_tile_4");
    let (_, plan) = plan_transpose_spans((0x1000, 64), (0x9000, 64), 1, 4, 16, 512)
        .unwrap()
        .unwrap();
    assert_eq!(plan, TransposePlan::Copy);
}
