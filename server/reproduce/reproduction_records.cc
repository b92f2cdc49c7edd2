#include "server/reproduce/reproduction_records.h"

#include <chrono>

#include "server/reproduce/json_fields.h"

namespace circuitlab::reproduce {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SetTime(int64_t us, google::protobuf::Timestamp* t) {
  t->set_seconds(us / 1000000);
  t->set_nanos(static_cast<int32_t>(us % 1000000) * 1000);
}

int64_t MicrosOf(const google::protobuf::Timestamp& t) { return t.seconds() * 1000000 + t.nanos() / 1000; }

bool Ended(v1::ReproductionState s) {
  return s == v1::REPRODUCTION_STATE_DONE || s == v1::REPRODUCTION_STATE_FAILED ||
         s == v1::REPRODUCTION_STATE_CANCELLED;
}

const v1::RecipeScale& ScaleOf(const v1::Reproduction& r) { return r.recipe().scales().at(r.scale()); }

v1::Reproduction Summary(const v1::Reproduction& r) {
  v1::Reproduction out = r;
  out.clear_recipe();
  out.clear_report();
  if (r.has_report()) {
    v1::ReproductionReport* rep = out.mutable_report();
    rep->set_passed(r.report().passed());
    rep->set_failed(r.report().failed());
    rep->set_inconclusive(r.report().inconclusive());
    rep->set_wall_seconds(r.report().wall_seconds());
  }
  return out;
}

std::vector<int> Unfinished() { return {v1::REPRODUCTION_STATE_TRAINING, v1::REPRODUCTION_STATE_ANALYSING}; }

store::ReproductionQuery Summaries(std::string owner, std::vector<int> states, int limit) {
  store::ReproductionQuery q;
  q.owner = std::move(owner);
  q.states = std::move(states);
  q.limit = limit;
  return q;
}

v1::SweepSpec SeededSweep(const v1::RecipeSweep& s, const v1::Reproduction& r, uint32_t k) {
  v1::SweepSpec out = s.sweep();
  out.set_name(r.recipe_id() + " " + r.scale() + " " + s.name() + " seed " + std::to_string(k + 1) + " (" +
               r.reproduction_id() + ")");
  if (out.base().name().empty()) out.mutable_base()->set_name(r.recipe_id() + "-" + s.name());
  out.mutable_base()->add_tags("reproduction:" + r.reproduction_id());
  v1::SweepAxis* seed = out.add_axes();
  seed->set_field(kSeedAxis);
  seed->set_name(kSeedAxis);
  seed->add_values()->set_number_value(static_cast<double>(out.base().seed() + k));
  return out;
}

std::string SweepKey(const v1::RecipeSweep& s, uint32_t k) { return s.name() + "/" + std::to_string(k + 1); }

}  // namespace circuitlab::reproduce
