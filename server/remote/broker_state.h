// What workers.cc (the workers' sessions) and leases.cc (a lease's life on
// the slot thread) share besides the broker's own state (workers.h).
// Internal to server/remote.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>


namespace circuitlab::remote {

inline constexpr uint32_t kMaxSlots = 64;
inline constexpr size_t kMaxField = 256;
inline constexpr auto kPoll = std::chrono::milliseconds(100);

inline std::string LeaseName(uint64_t id) { return "lease " + std::to_string(id); }

}  // namespace circuitlab::remote
