// circuitlab attention RUN [--step S] [--eval-set E] [--sequences N] [--layer
// L,...] [--head H,...] [--csv]
#include <algorithm>
#include <cstdio>
#include <vector>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace attention_cmd {

struct Options {
  std::string run_id, eval_set;
  uint64_t step = 0, seed = 0;
  uint32_t sequences = 0;
  std::vector<uint32_t> layers, heads;
  bool csv = false, force = false;
};

// One pattern as rows of shades, darkest for the largest weight of a row's
// keys: the previous-token stripe is the sub-diagonal, an induction head's
// off-diagonal sits one after the earlier copy of the query's token.
void Draw(const v1::AttentionPattern& p, const v1::AttentionSequence& seq) {
  static const char kShades[] = " .:-=+*#%@";
  const uint32_t T = p.size();
  std::printf("%s (layer %u, head %u), sequence %u\n", p.name().c_str(), p.layer(), p.head(), p.sequence());
  for (uint32_t q = 0; q < T; ++q) {
    std::printf("  %6lld |", static_cast<long long>(q < static_cast<uint32_t>(seq.tokens_size()) ? seq.tokens(q) : 0));
    for (uint32_t k = 0; k < T; ++k) {
      const float w = p.weights(static_cast<int>(q * T + k));
      const int shade = w <= 0 ? 0 : std::min(9, 1 + static_cast<int>(w * 9));
      std::putchar(k > q ? ' ' : kShades[shade]);
    }
    std::printf("|\n");
  }
}

int Run(Context& ctx, const Options& o) {
  v1::GetAttentionPatternsRequest req;
  req.set_run_id(o.run_id);
  req.set_step(o.step);
  req.set_eval_set(o.eval_set);
  req.set_sequences(o.sequences);
  req.set_seed(o.seed);
  req.mutable_layers()->Add(o.layers.begin(), o.layers.end());
  req.mutable_heads()->Add(o.heads.begin(), o.heads.end());
  v1::GetAttentionPatternsResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::GetAttentionPatternsResponse>(req);
  };
  if (auto rc = RunAnalysis(ctx, "attention patterns", o.force, call, &resp)) return *rc;
  if (o.csv) {
    std::printf(
        "run_id,step,eval_set,layer,head,name,sequence,query,key,query_"
        "token,key_token,weight\n");
    for (const v1::AttentionPattern& p : resp.patterns()) {
      const v1::AttentionSequence& seq = resp.sequences(static_cast<int>(p.sequence()));
      for (uint32_t q = 0; q < p.size(); ++q) {
        for (uint32_t k = 0; k <= q; ++k) {
          std::printf("%s,%llu,%s,%u,%u,%s,%u,%u,%u,%lld,%lld,%.6g\n", resp.run_id().c_str(),
                      static_cast<unsigned long long>(resp.step()), resp.eval_set().c_str(), p.layer(), p.head(),
                      p.name().c_str(), p.sequence(), q, k, static_cast<long long>(seq.tokens(static_cast<int>(q))),
                      static_cast<long long>(seq.tokens(static_cast<int>(k))),
                      p.weights(static_cast<int>(q * p.size() + k)));
        }
      }
    }
    return 0;
  }
  std::printf(
      "%s step %llu, %d sequence(s) of %s%s; rows are queries (token "
      "on the left), columns keys\n",
      resp.run_id().c_str(), static_cast<unsigned long long>(resp.step()), resp.sequences_size(),
      resp.eval_set().c_str(), resp.from_store() ? "  (stored answer)" : "");
  for (const v1::AttentionPattern& p : resp.patterns()) Draw(p, resp.sequences(static_cast<int>(p.sequence())));
  return 0;
}

}  // namespace attention_cmd
}  // namespace

void AddAttention(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<attention_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "attention",
                          "Each head's attention pattern on a few evaluation sequences at a stored "
                          "checkpoint, drawn as text\n"
                          "(query rows, key columns, darker = more weight) or exported as CSV. "
                          "IMIR and latent-task decoder runs.\n"
                          "An analysis job on the server; this command waits and shows progress.\n"
                          "  circuitlab attention r3 --sequences 1\n  circuitlab attention r3 "
                          "--layer 2 --head 1 --csv > induction.csv",
                          o, attention_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_option("--eval-set", o->eval_set, "Evaluation set (default: icl_rare for recall, id for a decoder)");
  sub->add_option("--sequences", o->sequences, "Sequences, 1 to 16 (default 4)");
  sub->add_option("--layer", o->layers, "Layers, counted from 1 (default: all)")->delimiter(',');
  sub->add_option("--head", o->heads, "Heads, counted from 1 (default: all)")->delimiter(',');
  sub->add_option("--seed", o->seed, "Seed of the sequences' draw (default: the run's)");
  sub->add_flag("--csv", o->csv, "CSV: one row per (pattern, query, key <= query)");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
