// BLS12-381 constants, and the field types instantiated over them.
//
// Limbs are 32-bit, little-endian. R = 2^256 for Fr and 2^384 for Fq, as in arkworks.
//   r  = 0x73eda753299d7d483339d80809a1d80553bda402fffe5bfeffffffff00000001 (255 bits)
//   p  = 0x1a0111ea397fe69a4b1ba7b6434bacd764774b84f38512bf6730d2a0f6b0f6241eabfffeb153ffffb9feffffffffaaab (381 bits)
// Fr: r - 1 = 2^32 · odd; multiplicative generator 7 (arkworks `Fr::GENERATOR`).
// G1: y^2 = x^3 + 4 over Fq (a = 0).
#pragma once

#include "field.cuh"

namespace bls12_381 {
static __device__ __constant__ __align__(16) const uint32_t FR_MOD[8] = {
    0x00000001, 0xffffffff, 0xfffe5bfe, 0x53bda402, 0x09a1d805, 0x3339d808, 0x299d7d48, 0x73eda753};
// R mod r
static __device__ __constant__ __align__(16) const uint32_t FR_ONE[8] = {
    0xfffffffe, 0x00000001, 0x00034802, 0x5884b7fa, 0xecbc4ff5, 0x998c4fef, 0xacc5056f, 0x1824b159};
// R^2 mod r
static __device__ __constant__ __align__(16) const uint32_t FR_RR[8] = {
    0xf3f29c6d, 0xc999e990, 0x87925c23, 0x2b6cedcb, 0x7254398f, 0x05d31496, 0x9f59ff11, 0x0748d9d9};
// -r^-1 mod 2^32. Not const, so nvcc reads it at run time: folding the known M0 = -1
// rewrites the reduction's multiply-adds so that ptxas can no longer pair them into
// wide IMADs (+65 % instructions in an Fr product).
static __device__ __constant__ uint32_t FR_M0 = 0xffffffff;

static __device__ __constant__ __align__(16) const uint32_t FP_MOD[12] = {
    0xffffaaab, 0xb9feffff, 0xb153ffff, 0x1eabfffe, 0xf6b0f624, 0x6730d2a0,
    0xf38512bf, 0x64774b84, 0x434bacd7, 0x4b1ba7b6, 0x397fe69a, 0x1a0111ea};
// R mod p
static __device__ __constant__ __align__(16) const uint32_t FP_ONE[12] = {
    0x0002fffd, 0x76090000, 0xc40c0002, 0xebf4000b, 0x53c758ba, 0x5f489857,
    0x70525745, 0x77ce5853, 0xa256ec6d, 0x5c071a97, 0xfa80e493, 0x15f65ec3};
// R^2 mod p
static __device__ __constant__ __align__(16) const uint32_t FP_RR[12] = {
    0x1c341746, 0xf4df1f34, 0x09d104f1, 0x0a76e6a6, 0x4c95b6d5, 0x8de5476c,
    0x939d83c0, 0x67eb88a9, 0xb519952d, 0x9a793e85, 0x92cae3aa, 0x11988fe5};
// -p^-1 mod 2^32
static __device__ __constant__ uint32_t FP_M0 = 0xfffcfffd;
}  // namespace bls12_381

// Scalar field Fr: 8 x u32, the layout of arkworks `ark_bls12_381::Fr`.
typedef mont_t<8, bls12_381::FR_MOD, bls12_381::FR_M0, bls12_381::FR_ONE, bls12_381::FR_RR> fr_t;
// Base field Fq: 12 x u32, the layout of arkworks `ark_bls12_381::Fq`.
typedef mont_t<12, bls12_381::FP_MOD, bls12_381::FP_M0, bls12_381::FP_ONE, bls12_381::FP_RR> fp_t;

static_assert(sizeof(fr_t) == 32, "fr_t must match arkworks Fr (32 bytes)");
static_assert(sizeof(fp_t) == 48, "fp_t must match arkworks Fq (48 bytes)");
