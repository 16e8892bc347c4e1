// The device's modular inversion (cuda/safegcd.cuh) compiled for the host, so that
// src/device/cuda/safegcd.rs can test it against arkworks on a machine without a GPU.
#include "../../../cuda/safegcd.cuh"

// BLS12-381 q and r, little-endian 32-bit words (cuda/bls12_381.cuh's FP_MOD, FR_MOD).
static const uint32_t Q[12] = {0xffffaaab, 0xb9feffff, 0xb153ffff, 0x1eabfffe, 0xf6b0f624, 0x6730d2a0,
                               0xf38512bf, 0x64774b84, 0x434bacd7, 0x4b1ba7b6, 0x397fe69a, 0x1a0111ea};
static const uint32_t R[8] = {0x00000001, 0xffffffff, 0xfffe5bfe, 0x53bda402,
                              0x09a1d805, 0x3339d808, 0x299d7d48, 0x73eda753};

extern "C" bool twolock_safegcd_fq(uint32_t* out, const uint32_t* x) { return safegcd::inverse<12>(out, x, Q); }
extern "C" bool twolock_safegcd_fr(uint32_t* out, const uint32_t* x) { return safegcd::inverse<8>(out, x, R); }
