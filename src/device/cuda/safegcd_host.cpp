// The device's modular inversion (cuda/safegcd.cuh) compiled for the host, so that
// src/device/cuda/safegcd.rs can test it against arkworks on a machine without a GPU.
#include "../../../cuda/safegcd.cuh"

// out = x^-1 mod m, `words` 32-bit words each (8 for r, 12 for q; false otherwise or
// when the divsteps did not finish).
extern "C" bool twolock_safegcd_inverse(uint32_t* out, const uint32_t* x, const uint32_t* m, int words) {
    switch (words) {
        case 8: return safegcd::inverse<8>(out, x, m);
        case 12: return safegcd::inverse<12>(out, x, m);
        default: return false;
    }
}
