// circuitlab activations RUN --tokens 4,9,... [--tokens ...] [--positions
// 0,1,...] [--sequences-file F] [--hook H,...] [--step S] [--csv]: the
// model's activations on your own sequences at named hook points.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace activations_cmd {

struct Options {
  std::string run_id, file;
  std::vector<std::string> tokens, positions, hooks;
  uint64_t step = 0;
  bool csv = false, force = false;
};

absl::Status Build(const Options& o, v1::GetActivationsRequest* req) {
  req->set_run_id(o.run_id);
  req->set_step(o.step);
  if (!o.file.empty()) {
    std::ifstream f(o.file);
    std::stringstream text;
    text << f.rdbuf();
    if (!f) return absl::InvalidArgumentError("--sequences-file: cannot read " + o.file);
    v1::GetActivationsRequest from;
    auto s = google::protobuf::util::JsonStringToMessage(text.str(), &from);
    if (!s.ok()) {
      return absl::InvalidArgumentError("--sequences-file " + o.file + ": " + std::string(s.message()) +
                                        " (expected {\"sequences\": [{\"tokens\": [...], \"positions\": [...]}]})");
    }
    *req->mutable_sequences() = from.sequences();
  }
  if (!o.positions.empty() && o.positions.size() != o.tokens.size()) {
    return absl::InvalidArgumentError("--positions: give one per --tokens (" + std::to_string(o.tokens.size()) +
                                      "), got " + std::to_string(o.positions.size()));
  }
  for (size_t i = 0; i < o.tokens.size(); ++i) {
    v1::InputSequence* s = req->add_sequences();
    for (int64_t t : ParseIds(o.tokens[i], "--tokens")) s->add_tokens(t);
    if (!o.positions.empty()) {
      for (int64_t p : ParseIds(o.positions[i], "--positions")) s->add_positions(p);
    }
  }
  if (req->sequences_size() == 0) return absl::InvalidArgumentError("give sequences: --tokens or --sequences-file");
  for (const std::string& h : SplitList(o.hooks)) req->add_hooks(h);
  return absl::OkStatus();
}

// The top `k` entries of a row of logits.
std::string Top(const float* row, int64_t n, int k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  const int64_t m = std::min<int64_t>(k, n);
  std::partial_sort(idx.begin(), idx.begin() + m, idx.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  std::string out;
  for (int64_t i = 0; i < m; ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%lld (%.3f)", i ? ", " : "", static_cast<long long>(idx[static_cast<size_t>(i)]),
                  row[idx[static_cast<size_t>(i)]]);
    out += buf;
  }
  return out;
}

int Run(Context& ctx, const Options& o) {
  v1::GetActivationsRequest req;
  if (absl::Status s = Build(o, &req); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  v1::GetActivationsResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::GetActivationsResponse>(req);
  };
  if (auto rc = RunAnalysis(ctx, "activations", o.force, call, &resp)) return *rc;
  if (o.csv) {
    // Long form: the axes after the sequence as axis1..axis3 (a stream:
    // position, index; attention: head, query, key; decoder heads:
    // position, head, index).
    std::printf("run_id,step,hook,sequence,axis1,axis2,axis3,value\n");
    for (const v1::HookActivation& a : resp.activations()) {
      std::vector<int64_t> shape(a.shape().begin(), a.shape().end());
      std::vector<int64_t> at(shape.size(), 0);
      for (int i = 0; i < a.values_size(); ++i) {
        std::printf("%s,%llu,%s", resp.run_id().c_str(), static_cast<unsigned long long>(resp.step()), a.hook().c_str());
        for (size_t d = 0; d < 4; ++d) {
          if (d < at.size()) {
            std::printf(",%lld", static_cast<long long>(at[d]));
          } else {
            std::printf(",");
          }
        }
        std::printf(",%.7g\n", a.values(i));
        for (size_t d = at.size(); d-- > 0;) {  // the next index, row-major
          if (++at[d] < shape[d]) break;
          at[d] = 0;
        }
      }
    }
    return 0;
  }
  std::printf("%s step %llu, %d sequence(s)%s\n", resp.run_id().c_str(), static_cast<unsigned long long>(resp.step()),
              req.sequences_size(), resp.from_store() ? "  (stored answer)" : "");
  for (const v1::HookActivation& a : resp.activations()) {
    std::string shape;
    for (uint32_t d : a.shape()) shape += (shape.empty() ? "" : " x ") + std::to_string(d);
    float lo = 0, hi = 0;
    double sum = 0;
    for (int i = 0; i < a.values_size(); ++i) {
      lo = i ? std::min(lo, a.values(i)) : a.values(i);
      hi = i ? std::max(hi, a.values(i)) : a.values(i);
      sum += a.values(i);
    }
    std::printf("  %-16s %s  min %.4g  max %.4g  mean %.4g\n", a.hook().c_str(), shape.c_str(), lo, hi,
                a.values_size() ? sum / a.values_size() : 0.0);
    if (a.hook() == "logits" && a.shape_size() == 3) {
      const int64_t T = a.shape(1), V = a.shape(2);
      for (uint32_t b = 0; b < a.shape(0); ++b) {
        std::printf("    sequence %u, last position: top %s\n", b,
                    Top(a.values().data() + (static_cast<int64_t>(b) * T + T - 1) * V, V, 3).c_str());
      }
    }
  }
  std::printf("(--csv for every value, --json for the answer)\n");
  return 0;
}

}  // namespace activations_cmd
}  // namespace

void AddActivations(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<activations_cmd::Options>();
  CLI::App* sub = AddVerb(
      app, chosen, "activations",
      "The model's activations at a stored checkpoint on sequences you write, at named hook points:\n"
      "IMIR embed, L{l}.attn, L{l}.H{h}.out, L{l}.resid; decoder embed, L{l}.resid_pre,\n"
      "L{l}.attn.pattern, L{l}.attn.head, L{l}.post_attn, L{l}.post_mlp; both: logits (layers and heads\n"
      "count from 1). The IMIR model reads a position id beside each token (--positions).\n"
      "An analysis job on the server; this command waits and shows progress.\n"
      "  circuitlab activations r1 --tokens 0,14,30,22,25,14 --positions 0,3,4,9,10,12 --hook L2.attn,logits\n"
      "  circuitlab activations r7 --tokens 3,1,4,1,5 --hook L1.post_mlp --csv > acts.csv",
      o, activations_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--tokens", o->tokens, "One sequence's token ids, comma-separated; repeat for more sequences");
  sub->add_option("--positions", o->positions, "IMIR: one sequence's position ids, one per --tokens");
  sub->add_option("--sequences-file", o->file,
                  "JSON {\"sequences\": [{\"tokens\": [...], \"positions\": [...]}, ...]} (with or beside --tokens)")
      ->check(CLI::ExistingFile);
  sub->add_option("--hook", o->hooks, "Hook points, comma-separated (default: logits)");
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_flag("--csv", o->csv, "CSV: one row per value (hook, sequence, axis1..axis3, value)");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
