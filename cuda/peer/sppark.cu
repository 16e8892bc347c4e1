// sppark (Supranational) as a benchmark peer: its G1 MSM and its NTT over BLS12-381,
// behind a small extern "C" surface that `src/peer.rs` wraps (feature `peer-sppark`).
//
// Compiled by build.rs's peer section with the `cc` crate (nvcc, static cudart), with
// -DFEATURE_BLS12_381 -DTAKE_RESPONSIBILITY_FOR_ERROR_MESSAGE and, when the blst
// crate was built with it, -D__ADX__. Include roots: DEP_SPPARK_ROOT and
// DEP_BLST_C_SRC (for blst_t.hpp, sppark's host-side field type).
//
// Layouts (all little-endian 64-bit limbs, checked by static_assert below):
//   base    96 bytes: x[6], y[6], Montgomery (R = 2^384); the point at infinity is
//           x = y = 0 (sppark's Affine_t::is_inf).
//   scalar  32 bytes: canonical (NOT Montgomery) value < r; passed with mont=false.
//   result 144 bytes: Jacobian X[6], Y[6], Z[6], Montgomery; Z = 0 is infinity.
//   fr      32 bytes: Montgomery (R = 2^256), for the NTT in and out.
//
// Every entry point returns 0 on success, else a nonzero code, and fills `status`:
//   code > 0: a cudaError_t (sppark reports CUDA errors negated; they are flipped);
//   code < 0: a failure that is not a CUDA error (TWOLOCK_PEER_E_*).
// No entry point aborts or lets a C++ exception cross into Rust.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#ifndef FEATURE_BLS12_381
# error "build.rs must define FEATURE_BLS12_381"
#endif

#include <ff/bls12-381.hpp>
#include <ec/jacobian_t.hpp>
#include <ec/xyzz_t.hpp>

typedef jacobian_t<fp_t> point_t;
typedef xyzz_t<fp_t> bucket_t;
typedef bucket_t::affine_t affine_t; // plain (x, y); (0, 0) is infinity
typedef fr_t scalar_t;

#include <msm/pippenger.cuh>
#include <ntt/ntt.cuh>

#ifndef __CUDA_ARCH__
static_assert(sizeof(fp_t) == 48, "fp_t is 6 x u64");
static_assert(sizeof(fr_t) == 32, "fr_t is 4 x u64");
static_assert(sizeof(affine_t) == 96, "affine_t is (x, y)");
static_assert(sizeof(affine_t::mem_t) == 96, "affine_t::mem_t is (x, y)");
static_assert(sizeof(point_t) == 144, "point_t is Jacobian (X, Y, Z)");
#endif

#define TWOLOCK_PEER_MSG_LEN 512
#define TWOLOCK_PEER_E_INVALID (-2) // bad arguments reached the glue
#define TWOLOCK_PEER_E_HOST (-3)    // a C++ exception that is not a CUDA error

extern "C" {
struct twolock_peer_status {
    int32_t code;
    char msg[TWOLOCK_PEER_MSG_LEN];
};
}

namespace {

int set_status(twolock_peer_status* st, int code, const char* msg)
{
    if (st != nullptr) {
        st->code = code;
        if (msg == nullptr)
            msg = "";
        std::strncpy(st->msg, msg, TWOLOCK_PEER_MSG_LEN - 1);
        st->msg[TWOLOCK_PEER_MSG_LEN - 1] = '\0';
    }
    return code;
}

// sppark's CUDA_OK throws cuda_error{-cudaError_t, ...}; report a positive code.
int cuda_code(int sppark_code)
{
    if (sppark_code < 0)
        return -sppark_code;
    return sppark_code == 0 ? TWOLOCK_PEER_E_HOST : sppark_code;
}

int from_rust_error(twolock_peer_status* st, const RustError& e, const char* what)
{
    int code = cuda_code(e.code);
    std::string msg = what;
    msg += ": ";
    if (e.message != nullptr) {
        msg += e.message;
        std::free(e.message); // RustError strdup()s; nobody else frees it here
    } else {
        msg += cudaGetErrorString((cudaError_t)code);
    }
    return set_status(st, code, msg.c_str());
}

#define PEER_CUDA(expr)                                                  \
    do {                                                                 \
        cudaError_t peer_code_ = (expr);                                 \
        if (peer_code_ != cudaSuccess) {                                 \
            std::string peer_msg_ = #expr " failed: ";                   \
            peer_msg_ += cudaGetErrorString(peer_code_);                 \
            throw cuda_error{-(int)peer_code_, peer_msg_};               \
        }                                                                \
    } while (0)

// A start/stop event pair, destroyed on every path.
class timer_pair_t {
    cudaEvent_t start_ = nullptr, stop_ = nullptr;

public:
    timer_pair_t()
    {
        PEER_CUDA(cudaEventCreate(&start_));
        cudaError_t e = cudaEventCreate(&stop_);
        if (e != cudaSuccess) {
            (void)cudaEventDestroy(start_);
            start_ = nullptr;
            PEER_CUDA(e);
        }
    }
    ~timer_pair_t()
    {
        if (start_) (void)cudaEventDestroy(start_);
        if (stop_) (void)cudaEventDestroy(stop_);
    }
    timer_pair_t(const timer_pair_t&) = delete;
    timer_pair_t& operator=(const timer_pair_t&) = delete;

    void start(cudaStream_t s) { PEER_CUDA(cudaEventRecord(start_, s)); }
    void stop(cudaStream_t s) { PEER_CUDA(cudaEventRecord(stop_, s)); }
    float elapsed_ms()
    {
        PEER_CUDA(cudaEventSynchronize(stop_));
        float ms = 0.0f;
        PEER_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
        return ms;
    }
};

class stream_guard_t {
    cudaStream_t s_ = nullptr;

public:
    stream_guard_t() { PEER_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~stream_guard_t()
    {
        if (s_) (void)cudaStreamDestroy(s_);
    }
    stream_guard_t(const stream_guard_t&) = delete;
    stream_guard_t& operator=(const stream_guard_t&) = delete;
    operator cudaStream_t() const { return s_; }
};

} // namespace

extern "C" {

// G1 MSM: uploads `bases` once (sppark's msm_t constructed with the points), then
// runs `runs + 1` invocations with `scalars` from host memory; the first is a
// warm-up. times_ms[i] is run i's time: CUDA events on an idle side stream
// bracketing sppark's synchronous msm_t::invoke, so it covers the scalar upload,
// every kernel, the bucket download and sppark's CPU-side final window sum (the
// result does not exist before that). `out` is the last run's result.
int twolock_sppark_msm_g1(const affine_t* bases, const scalar_t* scalars, size_t npoints,
                          uint32_t runs, point_t* out, float* times_ms,
                          twolock_peer_status* status)
{
    set_status(status, 0, "");
    if (bases == nullptr || scalars == nullptr || out == nullptr || times_ms == nullptr ||
        npoints == 0 || npoints >= ((size_t)1 << 31) || runs == 0)
        return set_status(status, TWOLOCK_PEER_E_INVALID,
                          "twolock_sppark_msm_g1: null pointer, npoints outside [1, 2^31) "
                          "or runs == 0");
    typedef msm_t<bucket_t, point_t, affine_t, scalar_t> msm_type;
    // Declared outside the try: ~msm_t() synchronizes with CUDA_OK, which throws on
    // a sticky error, and a throwing destructor would terminate the process. It is
    // destroyed only once the device is known to be healthy, else leaked (the
    // context is unusable by then anyway).
    std::unique_ptr<msm_type> msm;
    int rc = 0;
    try {
        msm.reset(new msm_type{bases, npoints, sizeof(affine_t)});
        // The constructor's upload is an async copy on sppark's stream 0, while
        // invoke() runs on its other streams: wait for the bases to land.
        PEER_CUDA(cudaDeviceSynchronize());

        stream_guard_t side;
        timer_pair_t timer;
        point_t res;
        res.inf();
        for (uint32_t i = 0; i <= runs && rc == 0; i++) {
            timer.start(side);
            RustError e = msm->invoke(res, static_cast<const affine_t*>(nullptr), npoints,
                                      scalars, /*mont=*/false, sizeof(affine_t));
            if (e.code != 0) {
                rc = from_rust_error(status, e, "sppark msm_t::invoke");
                break;
            }
            timer.stop(side);
            float ms = timer.elapsed_ms();
            if (i > 0)
                times_ms[i - 1] = ms;
        }
        if (rc == 0)
            *out = res;
    } catch (const cuda_error& e) {
        rc = set_status(status, cuda_code(e.code()), e.what());
    } catch (const std::exception& e) {
        rc = set_status(status, TWOLOCK_PEER_E_HOST, e.what());
    } catch (...) {
        rc = set_status(status, TWOLOCK_PEER_E_HOST, "unknown C++ exception in sppark MSM");
    }
    cudaError_t health = cudaDeviceSynchronize();
    if (health == cudaSuccess) {
        msm.reset();
    } else {
        (void)msm.release();
        if (rc == 0) {
            std::string msg = "cudaDeviceSynchronize after sppark MSM failed: ";
            msg += cudaGetErrorString(health);
            rc = set_status(status, (int)health, msg.c_str());
        }
    }
    return rc;
}

// The largest lg(domain size) sppark's NTT was compiled for.
uint32_t twolock_sppark_ntt_max_lg(void)
{
    return MAX_LG_DOMAIN_SIZE;
}

// Forward NTT, natural order in and out (sppark's NN: bit reversal, then
// Cooley-Tukey), over the 2^lg_n-th root of unity forward_roots_of_unity[lg_n],
// which is arkworks' Fr::get_root_of_unity(2^lg_n). `inout` (Montgomery) is
// uploaded once; each of `runs + 1` runs (the first a warm-up) restores the input
// with a device-to-device copy outside the timed span and times only
// NTT::Base_dev_ptr with CUDA events on sppark's stream. The last run's output is
// copied back into `inout`.
int twolock_sppark_ntt_forward(fr_t* inout, uint32_t lg_n, uint32_t runs, float* times_ms,
                               twolock_peer_status* status)
{
    set_status(status, 0, "");
    if (inout == nullptr || times_ms == nullptr || lg_n == 0 || lg_n > MAX_LG_DOMAIN_SIZE ||
        runs == 0)
        return set_status(status, TWOLOCK_PEER_E_INVALID,
                          "twolock_sppark_ntt_forward: null pointer, lg_n outside "
                          "[1, MAX_LG_DOMAIN_SIZE] or runs == 0");
    try {
        const gpu_t& gpu = select_gpu();
        // Build sppark's twiddle tables (launched on its other streams) before
        // anything is timed, and wait for them.
        (void)NTTParameters::all(false);
        PEER_CUDA(cudaDeviceSynchronize());

        const size_t n = (size_t)1 << lg_n;
        dev_ptr_t<fr_t> d_src{n, gpu};
        dev_ptr_t<fr_t> d_work{n, gpu};
        gpu.HtoD(&d_src[0], inout, n);

        stream_t& stream = gpu;
        cudaStream_t cs = gpu;
        timer_pair_t timer;
        for (uint32_t i = 0; i <= runs; i++) {
            PEER_CUDA(cudaMemcpyAsync(&d_work[0], &d_src[0], n * sizeof(fr_t),
                                      cudaMemcpyDeviceToDevice, cs));
            timer.start(cs);
            NTT::Base_dev_ptr(stream, &d_work[0], lg_n, NTT::InputOutputOrder::NN,
                              NTT::Direction::forward, NTT::Type::standard);
            timer.stop(cs);
            float ms = timer.elapsed_ms();
            if (i > 0)
                times_ms[i - 1] = ms;
        }
        gpu.DtoH(inout, &d_work[0], n);
        gpu.sync();
    } catch (const cuda_error& e) {
        (void)cudaDeviceSynchronize();
        return set_status(status, cuda_code(e.code()), e.what());
    } catch (const std::exception& e) {
        (void)cudaDeviceSynchronize();
        return set_status(status, TWOLOCK_PEER_E_HOST, e.what());
    } catch (...) {
        (void)cudaDeviceSynchronize();
        return set_status(status, TWOLOCK_PEER_E_HOST, "unknown C++ exception in sppark NTT");
    }
    return 0;
}

} // extern "C"
