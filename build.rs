//! Build script. With feature `cuda`, compiles every `cuda/*.cu` with nvcc into one
//! fatbin per file (SASS for sm_90 and sm_80, PTX for compute_90) in `OUT_DIR`, and
//! writes `OUT_DIR/kernels.rs` with `FATBINS: &[(module, bytes)]`, one entry per
//! `.cu` file, so a new kernel file needs no change here, and `ANCHORS: &[(module,
//! kernel)]`, one kernel name per module, from which the host enumerates the module's
//! functions to make them resident. Without the feature it does nothing CUDA-related.
//!
//! nvcc is looked up as `$NVCC`, then `$CUDA_HOME/bin/nvcc`, then `nvcc` on `PATH`.
//! `TWOLOCK_PTXAS_VERBOSE=1` passes `-Xptxas -v` and reports ptxas's register, stack
//! and spill lines as cargo warnings. `TWOLOCK_KERNELS` (for `twolock --version`) is a
//! digest of the `cuda/` sources, or says the build has no kernels.

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
    peer_sppark::build(); // feature `peer-sppark` only; see the section at the end
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        println!("cargo:rustc-env=TWOLOCK_KERNELS=none, built without cuda");
        return;
    }
    println!("cargo:rerun-if-changed=cuda");
    for var in ["NVCC", "CUDA_HOME", "TWOLOCK_PTXAS_VERBOSE"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    // The kernels' field inversion (cuda/safegcd.cuh, plain C++) for the host, so that
    // its unit tests (src/device/cuda/safegcd.rs) run without a GPU.
    println!("cargo:rerun-if-changed=src/device/cuda/safegcd_host.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .flag_if_supported("-Wno-unknown-pragmas") // the header's #pragma unroll is for nvcc
        .file("src/device/cuda/safegcd_host.cpp")
        .compile("twolock_safegcd_host");

    let nvcc = find_nvcc().unwrap_or_else(|| panic!("{HOW_TO_GET_NVCC}"));
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src_dir = manifest.join("cuda");
    // `twolock --version` names the sources its kernels came from; ci/gpu.sh compares.
    println!(
        "cargo:rustc-env=TWOLOCK_KERNELS={}",
        sources_digest(&src_dir)
    );
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
    rs.push_str(
        "/// One kernel name per module (the first `extern \"C\" __global__` outside a macro):\n\
         /// a handle from which the host finds the module's every function.\n\
         pub const ANCHORS: &[(&str, &str)] = &[\n",
    );
    for (module, _) in &results {
        let src = src_dir.join(format!("{module}.cu"));
        let text = std::fs::read_to_string(&src).expect("read a .cu file");
        let anchor = first_kernel(&text)
            .unwrap_or_else(|| panic!("{}: no extern \"C\" __global__ kernel", src.display()));
        writeln!(rs, "    ({module:?}, {anchor:?}),").expect("write to String");
    }
    rs.push_str("];\n");
    std::fs::write(out.join("kernels.rs"), rs).expect("write kernels.rs");
}

/// The first 16 hex digits of a SHA-256 over every file under `cuda/`, in byte order
/// of their paths, each as its path (`cuda/…`), a NUL, and its bytes. ci/gpu.sh computes
/// the same from the checkout it runs in: cargo reruns this script by file times, so an
/// archive built in another worktree against one target directory can carry stale
/// fatbins, and only a digest of the sources tells.
fn sources_digest(src_dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    fn walk(dir: &Path, rel: &str, files: &mut Vec<(String, PathBuf)>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
            let name = entry.file_name().to_string_lossy().into_owned();
            let (path, rel) = (entry.path(), format!("{rel}/{name}"));
            if path.is_dir() {
                walk(&path, &rel, files);
            } else {
                files.push((rel, path));
            }
        }
    }
    let mut files = Vec::new();
    walk(src_dir, "cuda", &mut files);
    files.sort();
    let mut h = Sha256::new();
    for (rel, path) in &files {
        h.update(rel.as_bytes());
        h.update([0]);
        h.update(std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {rel}: {e}")));
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The name of the first `extern "C" __global__` function of a .cu file, skipping
/// comments and `#define` bodies (their names are macro parameters).
fn first_kernel(text: &str) -> Option<String> {
    // Block comments out first, then line comments and macros line by line.
    let mut uncommented = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        uncommented.push_str(&rest[..start]);
        rest = rest[start + 2..]
            .find("*/")
            .map_or("", |end| &rest[start + 2 + end + 2..]);
    }
    uncommented.push_str(rest);
    let mut code = String::new();
    let mut in_macro = false;
    for line in uncommented.lines() {
        let line = line.find("//").map_or(line, |i| &line[..i]);
        let t = line.trim_start();
        if in_macro || t.starts_with("#define") {
            in_macro = line.trim_end().ends_with('\\');
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    let after = &code[code.find("extern \"C\" __global__")? + 21..];
    let mut rest = after.trim_start().strip_prefix("void")?.trim_start();
    if let Some(r) = rest.strip_prefix("__launch_bounds__(") {
        rest = r[r.find(')')? + 1..].trim_start();
    }
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
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

// ---------------------------------------------------------------------------------------
// Feature `peer-sppark`: sppark's CUDA MSM and NTT as a benchmark peer.
//
// A no-op unless CARGO_FEATURE_PEER_SPPARK is set. Compiles `cuda/peer/sppark.cu` (the
// extern "C" glue that `src/peer.rs` wraps) with the `cc` crate and nvcc into a static
// library linked into the crate, with the CUDA runtime linked statically
// (`libcudart_static.a`), so the binaries need no libcudart.so at run time: only the
// driver's libcuda.so, which the runtime loads itself. Independent of the fatbin build
// above: the peer is host-callable C++ with its own kernels, not a module for cudarc.
// ---------------------------------------------------------------------------------------
mod peer_sppark {
    use std::env;
    use std::path::{Path, PathBuf};

    /// SASS for H100/H200 plus compute_90 PTX, as the brief for the peer asks.
    const PEER_GENCODE: &[&str] = &[
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_90,code=compute_90",
    ];

    pub fn build() {
        if env::var_os("CARGO_FEATURE_PEER_SPPARK").is_none() {
            return;
        }
        println!("cargo:rerun-if-changed=cuda/peer");
        for var in ["NVCC", "CUDA_HOME"] {
            println!("cargo:rerun-if-env-changed={var}");
        }

        let nvcc = super::find_nvcc().unwrap_or_else(|| panic!("{}", super::HOW_TO_GET_NVCC));
        // sppark's own build script compiles the GPU registry (`select_gpu` & co.) into
        // libsppark_cuda.a only when it finds nvcc, and it looks only at $NVCC and PATH
        // (not CUDA_HOME): without that the link fails with undefined `select_gpu`.
        let nvcc_env_set = env::var_os("NVCC").is_some_and(|v| !v.is_empty());
        let nvcc_on_path = env::var_os("PATH")
            .is_some_and(|p| env::split_paths(&p).any(|d| d.join("nvcc").is_file()));
        if !nvcc_env_set && !nvcc_on_path {
            panic!(
                "feature `peer-sppark`: found {} through CUDA_HOME, but sppark's build script \
                 only looks at $NVCC and PATH; set NVCC={0}",
                nvcc.display()
            );
        }

        // Exported by the sppark and blst crates (`links = "sppark"` / `"blst"`).
        let sppark_root = dep_dir("DEP_SPPARK_ROOT");
        let blst_src = dep_dir("DEP_BLST_C_SRC");

        // cc takes the CUDA compiler from $NVCC only; point it at the one found above.
        // (Edition 2021: set_var is safe; no other thread is running at this point.)
        env::set_var("NVCC", &nvcc);

        let manifest =
            PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
        let src = manifest.join("cuda").join("peer").join("sppark.cu");

        let mut nvcc_build = cc::Build::new();
        nvcc_build
            .cuda(true)
            .cudart("static")
            // The release profile has debug = 1: cc would pass nvcc `-G`, which turns
            // off device optimisation and would make the peer's timings meaningless.
            .debug(false)
            .opt_level(2)
            .flag("-std=c++17")
            .flag("-Xcompiler")
            .flag("-Wno-unused-function")
            .flag("-Xcompiler")
            .flag("-Wno-unused-parameter")
            .flag("-Xcompiler")
            .flag("-Wno-subobject-linkage")
            .define("FEATURE_BLS12_381", None)
            .define("TAKE_RESPONSIBILITY_FOR_ERROR_MESSAGE", None)
            .include(&sppark_root)
            .include(&blst_src)
            .file(&src);
        for flag in PEER_GENCODE {
            nvcc_build.flag(flag);
        }
        // sppark's host-side field type (blst_t.hpp) calls blst's assembly. The blst
        // crate builds only the mulx (ADX) entry points when it defines __ADX__, and
        // the rest otherwise: follow the same decision, or the link fails.
        if blst_defines_adx() {
            nvcc_build.define("__ADX__", None);
        }
        nvcc_build.compile("twolock_sppark_peer");

        // libcudart_static.a needs these on older glibc (on glibc >= 2.34 they are
        // empty stubs and --as-needed drops them).
        for lib in ["dl", "rt", "pthread"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }

    fn dep_dir(var: &str) -> PathBuf {
        let dir = env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
            panic!("feature `peer-sppark`: {var} is not set (is the dependency enabled?)")
        });
        if !Path::new(&dir).is_dir() {
            panic!(
                "feature `peer-sppark`: {var}={} is not a directory",
                dir.display()
            );
        }
        dir
    }

    /// The blst crate's (0.3.17) rule for defining __ADX__ on x86_64, for a build
    /// without its `portable` / `force-adx` features (this crate enables neither).
    fn blst_defines_adx() -> bool {
        if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
            return false;
        }
        if env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("sgx") {
            return true;
        }
        if env::var("CARGO_ENCODED_RUSTFLAGS")
            .unwrap_or_default()
            .contains("target-cpu=")
        {
            let features = env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
            let features: Vec<&str> = features.split(',').collect();
            return features.contains(&"ssse3") && features.contains(&"adx");
        }
        host_has_adx()
    }

    #[cfg(target_arch = "x86_64")]
    fn host_has_adx() -> bool {
        std::is_x86_feature_detected!("adx")
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn host_has_adx() -> bool {
        false
    }
}
