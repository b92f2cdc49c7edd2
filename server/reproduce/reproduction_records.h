// A reproduction's record, as the job (reproduction_steps.cc) and the core
// (reproductions.cc) both read and write it: times, states, the sweep of each
// seed and its key, and the stored summaries. Internal to server/reproduce.
#pragma once

#include <google/protobuf/timestamp.pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include "circuitlab/v1/reproduce.pb.h"
#include "server/store/store.h"

namespace circuitlab::reproduce {

int64_t NowUs();
void SetTime(int64_t us, google::protobuf::Timestamp* t);
int64_t MicrosOf(const google::protobuf::Timestamp& t);
// DONE, FAILED or CANCELLED.
bool Ended(v1::ReproductionState s);
// The recipe's scale the reproduction runs (it exists: Begin checked).
const v1::RecipeScale& ScaleOf(const v1::Reproduction& r);
// The record in the BASIC view: no recipe and, of the report, its counts.
v1::Reproduction Summary(const v1::Reproduction& r);
// TRAINING and ANALYSING.
std::vector<int> Unfinished();
// The summaries of `owner`'s (everyone's when empty) newest `limit` in `states`.
store::ReproductionQuery Summaries(std::string owner, std::vector<int> states, int limit);
// The sweep of seed `k` (0-based) as the reproduction submits it: named
// after the reproduction, tagged with its id, with a one-value seed axis
// added last (one sweep per seed keeps each within a client's queue).
v1::SweepSpec SeededSweep(const v1::RecipeSweep& s, const v1::Reproduction& r, uint32_t k);
// The key of seed k's sweep in Reproduction.sweeps: "plane/1".
std::string SweepKey(const v1::RecipeSweep& s, uint32_t k);

}  // namespace circuitlab::reproduce
