// Deterministic seed derivation. Every random draw in circuitlab comes from a
// generator seeded by DeriveSeed(master, purpose[, index...]), so a run is
// reproducible from its master seed and a resumed run redraws exactly what the
// uninterrupted run would have drawn.
#pragma once

#include <cstdint>
#include <string_view>

namespace circuitlab {

// SplitMix64 finaliser: a bijective 64-bit mixer.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// FNV-1a over the purpose string, so purposes are named, not numbered.
constexpr uint64_t HashPurpose(std::string_view purpose) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (char c : purpose) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ULL;
  }
  return h;
}

constexpr uint64_t DeriveSeed(uint64_t master, std::string_view purpose, uint64_t index = 0) {
  return Mix64(Mix64(master ^ HashPurpose(purpose)) + Mix64(index + 0x632BE59BD9B4E019ULL));
}

// Seeds as torch/std generators take them (63 bits keeps them non-negative
// when a consumer stores them as int64).
constexpr uint64_t DeriveSeed63(uint64_t master, std::string_view purpose, uint64_t index = 0) {
  return DeriveSeed(master, purpose, index) >> 1;
}

// The seed of a run member's fixed task pool (its evaluation sets and, for
// the block tasks, the token pools): trainers, analyses and the facade all
// draw the same pool from a member's seed.
constexpr uint64_t PoolSeedOf(uint64_t member_seed) { return DeriveSeed63(member_seed, "pool"); }

}  // namespace circuitlab
