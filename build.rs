//! Build script. With feature `cuda`, compiles every `cuda/*.cu` with nvcc into one
//! fatbin per file (SASS for sm_90 and sm_80, PTX for compute_90) in `OUT_DIR`, and
//! writes `OUT_DIR/kernels.rs` with `FATBINS: &[(module, bytes)]`, one entry per
//! `.cu` file, so a new kernel file needs no change here. Without the feature it does
//! nothing CUDA-related.
//!
//! nvcc is looked up as `$NVCC`, then `$CUDA_HOME/bin/nvcc`, then `nvcc` on `PATH`.
//! `TWOLOCK_PTXAS_VERBOSE=1` passes `-Xptxas -v` and reports ptxas's register, stack
//! and spill lines as cargo warnings.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Real SASS for H100/H200 and A100, plus compute_90 PTX for the driver to JIT on
/// anything newer. Never build with an nvcc newer than the GPU machine's driver.
const GENCODE: &[&str] = &[
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=compute_90",
];

const HOW_TO_GET_NVCC: &str = "feature `cuda` needs nvcc 13.0 (the GPU machine's driver is \
    CUDA 13.0; never use a newer one). Install the pinned wheels with \
    `bash ci/install-nvcc.sh` and then `export NVCC=$HOME/.cache/twolock/nvcc/nvidia/cu13/bin/nvcc` \
    (the script prints the line), or set CUDA_HOME, or put nvcc on PATH.";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed=cuda");
    for var in ["NVCC", "CUDA_HOME", "TWOLOCK_PTXAS_VERBOSE"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let nvcc = find_nvcc().unwrap_or_else(|| panic!("{HOW_TO_GET_NVCC}"));
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src_dir = manifest.join("cuda");
    let verbose = env::var("TWOLOCK_PTXAS_VERBOSE").is_ok_and(|v| v == "1");

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&src_dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", src_dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "cu"))
        .collect();
    sources.sort();

    // nvcc is slow on big-integer code (tens of seconds per file): compile in parallel.
    let results: Vec<(String, PathBuf)> = std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .iter()
            .map(|src| {
                let (nvcc, src_dir, out) = (&nvcc, &src_dir, &out);
                scope.spawn(move || compile(nvcc, src_dir, src, out, verbose))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("nvcc worker thread panicked"))
            })
            .collect()
    });

    let mut rs = String::from(
        "/// One fatbin per `cuda/*.cu` file: (module name = file stem, fatbin bytes).\n\
         pub const FATBINS: &[(&str, &[u8])] = &[\n",
    );
    for (module, fatbin) in &results {
        let path = fatbin.to_str().expect("OUT_DIR path is UTF-8");
        writeln!(rs, "    ({module:?}, include_bytes!({path:?})),").expect("write to String");
    }
    rs.push_str("];\n");
    std::fs::write(out.join("kernels.rs"), rs).expect("write kernels.rs");
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(nvcc) = env::var_os("NVCC").filter(|v| !v.is_empty()) {
        let nvcc = PathBuf::from(nvcc);
        if nvcc.is_file() {
            return Some(nvcc);
        }
        panic!("NVCC={} is not a file. {HOW_TO_GET_NVCC}", nvcc.display());
    }
    if let Some(home) = env::var_os("CUDA_HOME").filter(|v| !v.is_empty()) {
        let nvcc = Path::new(&home).join("bin").join("nvcc");
        if nvcc.is_file() {
            return Some(nvcc);
        }
    }
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join("nvcc"))
        .find(|p| p.is_file())
}

/// Compiles one `.cu` file to `OUT_DIR/<stem>.fatbin`; returns (stem, fatbin path).
fn compile(
    nvcc: &Path,
    include: &Path,
    src: &Path,
    out: &Path,
    verbose: bool,
) -> (String, PathBuf) {
    let module = src
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_else(|| panic!("non-UTF-8 kernel file name {}", src.display()))
        .to_owned();
    let fatbin = out.join(format!("{module}.fatbin"));
    let mut cmd = Command::new(nvcc);
    cmd.arg("-fatbin")
        .args(GENCODE)
        .args(["-O3", "-std=c++17", "--expt-relaxed-constexpr"])
        .arg("-I")
        .arg(include)
        .arg("-o")
        .arg(&fatbin)
        .arg(src);
    if verbose {
        cmd.args(["-Xptxas", "-v"]);
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}. {HOW_TO_GET_NVCC}", nvcc.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        panic!(
            "nvcc failed on {} ({}):\n{}{}",
            src.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            stderr
        );
    }
    if verbose {
        // ptxas prints "Compiling entry function 'k' for 'sm_90'", then the stack and
        // spill line, then "Used N registers, ...": report them all, tagged by module.
        for line in stderr.lines() {
            let line = line.trim();
            if line.starts_with("ptxas info") && !line.contains("Compile time")
                || line.contains("bytes stack frame")
            {
                println!("cargo:warning=[{module}] {line}");
            }
        }
    }
    (module, fatbin)
}
