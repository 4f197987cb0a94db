//! hipRTC: compiling the kernel sources for a device's architecture.

use super::*;

/// Checks an AMD GPU target ID (`gcnArchName`): a processor `gfx<...>` (letters, digits and
/// `-` for the generic targets such as `gfx9-generic`) followed by any number of
/// `:<feature>+` / `:<feature>-` settings (`gfx90a:sramecc+:xnack-`). Surrounding
/// whitespace and NUL padding are dropped; the result is what hipRTC's `--offload-arch`
/// takes.
pub fn parse_arch(raw: &str) -> Result<String> {
    let s = raw.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    let bad = || {
        Error::invalid(format!(
            "'{raw}' is not an AMD GPU architecture: expected gfx<id> with optional \
             :feature+ / :feature- settings, such as gfx90a or gfx90a:sramecc+:xnack-"
        ))
    };
    let mut parts = s.split(':');
    let proc_ = parts.next().unwrap_or_default();
    let id = proc_.strip_prefix("gfx").ok_or_else(bad)?;
    if id.is_empty()
        || !id.starts_with(|c: char| c.is_ascii_digit())
        || !id
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase() || c == '-')
    {
        return Err(bad());
    }
    for f in parts {
        let name = f
            .strip_suffix('+')
            .or_else(|| f.strip_suffix('-'))
            .ok_or_else(bad)?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(bad());
        }
    }
    Ok(s.to_string())
}

/// The hipRTC options the kernels are compiled with for target `arch` (checked with
/// [`parse_arch`]): the architecture (`--offload-arch`, which hipRTC treats as its
/// `--gpu-architecture`), the unroll factor the host's launch arithmetic assumes, C++17,
/// full optimisation, and no floating-point contraction (results must match the host's
/// separately rounded operations).
pub fn compile_options(arch: &str) -> Result<Vec<String>> {
    let arch = parse_arch(arch)?;
    Ok(vec![
        format!("--offload-arch={arch}"),
        format!("-DPCCL_UNROLL={UNROLL}"),
        "-std=c++17".to_string(),
        "-O3".to_string(),
        "-ffp-contract=off".to_string(),
    ])
}

/// The text hipRTC compiles for kernel source `src` named `name`: [`HIP_PRELUDE`], then the
/// source with its own line numbers.
pub fn hip_source(name: &str, src: &str) -> String {
    format!("{HIP_PRELUDE}#line 1 \"{name}\"\n{src}")
}

/// Finds the architecture string (`gcnArchName`) in the bytes of a `hipDeviceProp_t`
/// without knowing its layout: the NUL-terminated strings starting with `gfx` that
/// [`parse_arch`] accepts, preferring one with feature settings (the marketing `name` field
/// comes first and holds none), else the last one.
pub fn find_arch_in_properties(bytes: &[u8]) -> Option<String> {
    let mut found: Vec<String> = Vec::new();
    let mut i = 0;
    while i + 3 <= bytes.len() {
        if &bytes[i..i + 3] == b"gfx" && (i == 0 || bytes[i - 1] == 0) {
            let end = bytes[i..]
                .iter()
                .position(|&b| b == 0)
                .map_or(bytes.len(), |p| i + p);
            if let Ok(s) = std::str::from_utf8(&bytes[i..end]) {
                if let Ok(a) = parse_arch(s) {
                    found.push(a);
                }
            }
            i = end;
        } else {
            i += 1;
        }
    }
    found
        .iter()
        .find(|a| a.contains(':'))
        .or(found.last())
        .cloned()
}

/// The two kernel modules compiled for one architecture: AMD GPU code objects.
#[derive(Clone, Debug)]
pub struct HipKernelImages {
    /// The architecture they were compiled for.
    pub arch: String,
    /// `csrc/reduce.cu`
    pub reduce: Vec<u8>,
    /// `csrc/transpose.cu`
    pub transpose: Vec<u8>,
}

pub(super) struct RtcProgram<'a> {
    api: &'a HiprtcApi,
    prog: HiprtcProgram,
}

impl Drop for RtcProgram<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by hiprtcCreateProgram and is destroyed only here.
        let _ = unsafe { (self.api.hiprtcDestroyProgram)(&mut self.prog) };
    }
}

pub(super) fn compile_one(
    rtc: &HiprtcApi,
    name: &str,
    src: &str,
    options: &[String],
) -> Result<Vec<u8>> {
    let c_src = CString::new(hip_source(name, src))
        .map_err(|_| Error::internal(format!("{name}: NUL byte in kernel source")))?;
    let c_name = CString::new(name).map_err(|_| Error::internal("NUL byte in kernel name"))?;
    let c_opts = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::internal("NUL byte in a hipRTC option"))?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog = RtcProgram {
        api: rtc,
        prog: null_mut(),
    };
    // SAFETY: source and name are NUL-terminated and outlive the call; no headers are passed
    // (0 and null arrays); `prog.prog` is a valid out-pointer.
    let r = unsafe {
        (rtc.hiprtcCreateProgram)(
            &mut prog.prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    rtc.check(r, &format!("hiprtcCreateProgram ({name})"))?;
    // SAFETY: `prog` is live; `opt_ptrs` holds `len` pointers to NUL-terminated options that
    // `c_opts` keeps alive.
    let r = unsafe {
        (rtc.hiprtcCompileProgram)(prog.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr())
    };
    if r != HIPRTC_SUCCESS {
        let mut size = 0usize;
        // SAFETY: `prog` is live; `size` is a valid out-pointer.
        let log = if unsafe { (rtc.hiprtcGetProgramLogSize)(prog.prog, &mut size) }
            == HIPRTC_SUCCESS
            && size > 0
        {
            let mut buf = vec![0u8; size];
            // SAFETY: `buf` holds the `size` bytes hipRTC reported for the log.
            let ok = unsafe { (rtc.hiprtcGetProgramLog)(prog.prog, buf.as_mut_ptr().cast()) };
            if ok == HIPRTC_SUCCESS {
                let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                String::from_utf8_lossy(&buf[..end]).into_owned()
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        let err = rtc.check(r, "hiprtcCompileProgram").unwrap_err();
        return Err(Error::system(format!(
            "{} for {name} ({}):\n{log}",
            err.message(),
            options.join(" ")
        )));
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
    rtc.check(
        unsafe { (rtc.hiprtcGetCodeSize)(prog.prog, &mut size) },
        "hiprtcGetCodeSize",
    )?;
    let mut code = vec![0u8; size];
    // SAFETY: `code` holds the `size` bytes hipRTC reported.
    rtc.check(
        unsafe { (rtc.hiprtcGetCode)(prog.prog, code.as_mut_ptr().cast()) },
        "hiprtcGetCode",
    )?;
    if code.is_empty() {
        return Err(Error::system(format!(
            "hipRTC produced no code for {name} ({})",
            options.join(" ")
        )));
    }
    Ok(code)
}

/// Compiles both kernel modules with hipRTC for AMD architecture `arch` (a `gcnArchName`
/// such as `gfx942:sramecc+:xnack-`). Needs only hipRTC, no GPU.
pub fn compile_kernels(arch: &str) -> Result<HipKernelImages> {
    let options = compile_options(arch)?;
    let rtc = hiprtc_api()?;
    Ok(HipKernelImages {
        arch: parse_arch(arch)?,
        reduce: compile_one(
            rtc,
            "reduce.cu",
            &super::super::launch::reduce_module_source(REDUCE_SOURCE),
            &options,
        )?,
        transpose: compile_one(rtc, "transpose.cu", TRANSPOSE_SOURCE, &options)?,
    })
}
