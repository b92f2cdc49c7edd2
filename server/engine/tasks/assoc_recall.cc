#include "server/engine/tasks/assoc_recall.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "server/engine/torch_util.h"

namespace circuitlab::engine {

AssocRecallConfig AssocRecallConfig::FromSpec(const v1::ExperimentSpec& spec) {
  const auto& t = spec.task().associative_recall();
  const auto& d = spec.data();
  AssocRecallConfig c;
  c.num_common = t.num_common();
  c.num_rare = t.num_rare();
  c.num_heldout = t.num_heldout();
  c.num_blocks = t.num_blocks();
  c.block_length = t.block_length();
  c.absolute_positions = t.position_mode() == v1::POSITION_MODE_ABSOLUTE;
  c.num_positions = t.num_positions();
  c.rare_fraction = d.rare_fraction();
  c.variability = d.variability();
  c.variant_mode = d.variability_mode() == v1::VARIABILITY_MODE_VARIANT;
  c.zipf_exponent = d.zipf_exponent();
  c.burstiness = d.burstiness();
  c.max_gap = d.max_gap();
  return c;
}

AssocRecallTask::AssocRecallTask(const AssocRecallConfig& config, uint64_t pool_seed) : cfg_(config) {
  vocab_ = kNumSpecials + cfg_.num_common + cfg_.num_rare + cfg_.num_heldout;
  seq_len_ = 1 + cfg_.num_blocks * (cfg_.block_length + cfg_.max_gap) + (cfg_.block_length - 1);
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(pool_seed);
  const int64_t npairs = cfg_.num_common / 2;
  pairs_ = (torch::randperm(cfg_.num_common, gen, kI64) + kNumSpecials).view({npairs, 2});
  // rank[p] = Zipf rank (0-based) of pair p; P(rank r) ~ (r+1)^-zeta.
  torch::Tensor rank = torch::randperm(npairs, gen, kI64).to(torch::kDouble);
  pair_log_w_ = -cfg_.zipf_exponent * torch::log(rank + 1.0);
  partner_ = torch::full({vocab_}, -1, kI64);
  pair_of_tok_ = torch::full({vocab_}, -1, kI64);
  if (npairs > 0) {
    torch::Tensor left = pairs_.select(1, 0), right = pairs_.select(1, 1);
    partner_.index_put_({left}, right);
    partner_.index_put_({right}, left);
    torch::Tensor ids = torch::arange(npairs, kI64);
    pair_of_tok_.index_put_({left}, ids);
    pair_of_tok_.index_put_({right}, ids);
  }
}

int64_t AssocRecallTask::num_positions() const { return cfg_.absolute_positions ? seq_len_ : cfg_.num_positions; }

bool AssocRecallTask::Supports(SampleMode mode) const {
  const int64_t npairs = cfg_.num_common / 2;
  switch (mode) {
    case SampleMode::kTrain:
    case SampleMode::kIclRare:
      return true;
    case SampleMode::kIclHoldout:
      return cfg_.num_heldout >= 2;
    case SampleMode::kIwl:
      return npairs >= 1;
    case SampleMode::kConflict:
      return npairs >= 2;
    case SampleMode::kTest:
      return false;
  }
  return false;
}

namespace {

// The sequences' layout: BOS, leading fillers, [gap fillers, block] x n
// (blocks keys `bkey` and values `bval` [B, n], already shuffled), the query
// block ending in `key`; tokens, position ids and each token's block.
Batch Layout(const AssocRecallConfig& cfg, int64_t T, const torch::Tensor& bkey, const torch::Tensor& bval,
             const torch::Tensor& key, torch::Generator& gen) {
  using torch::indexing::Slice;
  const int64_t B = bkey.size(0), n = cfg.num_blocks, k = cfg.block_length;
  torch::Tensor gaps =
      cfg.max_gap > 0 ? torch::randint(0, cfg.max_gap + 1, {B, n}, gen, kI64) : torch::zeros({B, n}, kI64);
  torch::Tensor gsum = gaps.cumsum(1);
  torch::Tensor lead = n * cfg.max_gap - gsum.select(1, n - 1);
  torch::Tensor start = 1 + lead.unsqueeze(1) + gsum + torch::arange(n, kI64).unsqueeze(0) * k;
  const int64_t qstart = T - (k - 1);

  torch::Tensor tokens = torch::full({B, T}, kFill, kI64);
  tokens.scatter_(1, start, bkey);
  tokens.scatter_(1, start + (k - 1), bval);
  tokens.index_put_({Slice(), qstart}, key);

  torch::Tensor block_of = torch::full({B, T}, -1, kI64);
  torch::Tensor block_ids = torch::arange(n, kI64).unsqueeze(0).expand({B, n});
  for (int64_t j = 0; j < k; ++j) block_of.scatter_(1, start + j, block_ids);
  block_of.index_put_({Slice(), Slice(qstart, T)}, n);

  torch::Tensor pids;
  if (cfg.absolute_positions) {
    pids = torch::arange(T, kI64).unsqueeze(0).expand({B, T}).contiguous();
  } else {
    const int64_t P = cfg.num_positions;
    pids = torch::randint(0, P, {B, T}, gen, kI64);  // fillers and BOS: independent uniform
    torch::Tensor phi = torch::randint(0, P, {B, n + 1}, gen, kI64);
    torch::Tensor bphi = phi.narrow(1, 0, n);
    for (int64_t j = 0; j < k; ++j) pids.scatter_(1, start + j, (bphi + j).remainder(P));
    for (int64_t j = 0; j < k - 1; ++j) pids.index_put_({Slice(), qstart + j}, (phi.select(1, n) + j).remainder(P));
  }

  Batch out;
  out.tokens = tokens;
  out.pids = pids;
  out.block_of_token = block_of;
  return out;
}

// A sample mode's query class (rare or common per sequence), the copies of
// the query's block in context and the chance a distractor is rare.
struct QueryPlan {
  torch::Tensor rare_query;
  int64_t copies = 1;
  double dist_rare = 1.0;
};
QueryPlan PlanQueries(const AssocRecallConfig& cfg, int64_t npairs, int64_t B, SampleMode mode,
                      torch::Generator& gen) {
  QueryPlan q;
  q.dist_rare = npairs == 0 ? 1.0 : cfg.rare_fraction;
  switch (mode) {
    case SampleMode::kTrain:
      q.rare_query = npairs == 0 ? torch::ones({B}, torch::kBool) : Coin({B}, cfg.rare_fraction, gen);
      q.copies = cfg.burstiness;
      break;
    case SampleMode::kIclRare:
    case SampleMode::kIclHoldout:
      q.rare_query = torch::ones({B}, torch::kBool);
      q.dist_rare = 1.0;
      break;
    case SampleMode::kIwl:
      q.rare_query = torch::zeros({B}, torch::kBool);
      q.copies = 0;
      break;
    case SampleMode::kConflict:
      q.rare_query = torch::zeros({B}, torch::kBool);
      break;
    case SampleMode::kTest:
      throw std::invalid_argument("associative recall has no kTest sample mode");
  }
  return q;
}

// The common distractors: where `want_common` [B, n], an unused common pair
// drawn by Zipf weight without replacement (Gumbel top-k over the pairs not
// `excluded`), in a random orientation, replaces the rare one in *dkey/*dval;
// a slot that finds no unused pair stays rare.
void CommonDistractors(const torch::Tensor& pair_log_w, const torch::Tensor& pairs, const torch::Tensor& want_common,
                       const torch::Tensor& excluded, torch::Generator& gen, torch::Tensor* dkey, torch::Tensor* dval) {
  const int64_t B = want_common.size(0), n = want_common.size(1), npairs = pair_log_w.size(0);
  const int64_t m = std::min(n, npairs);
  torch::Tensor u = torch::rand({B, npairs}, gen, kF64).clamp_min(1e-300);
  torch::Tensor gumbel_keys = pair_log_w.unsqueeze(0) - torch::log(-torch::log(u));
  gumbel_keys.masked_fill_(excluded, -std::numeric_limits<double>::infinity());
  auto [cand_val, cand_idx] = gumbel_keys.topk(m, 1);
  torch::Tensor crank = (want_common.to(torch::kLong).cumsum(1) - 1).clamp(0, m - 1);
  torch::Tensor got = cand_val.gather(1, crank).isfinite();
  torch::Tensor has_rank = want_common.to(torch::kLong).cumsum(1) <= m;
  torch::Tensor use_common = want_common.logical_and(got).logical_and(has_rank);
  torch::Tensor cpair = cand_idx.gather(1, crank);
  torch::Tensor corient = Coin({B, n}, 0.5, gen).to(torch::kLong);
  torch::Tensor ckey = pairs.index({cpair, corient}), cval = pairs.index({cpair, 1 - corient});
  *dkey = torch::where(use_common, ckey, *dkey);
  *dval = torch::where(use_common, cval, *dval);
}

}  // namespace

Batch AssocRecallTask::Sample(int64_t B, SampleMode mode, torch::Generator& gen) const {
  using torch::indexing::Slice;
  const int64_t n = cfg_.num_blocks, T = seq_len_;
  const int64_t npairs = cfg_.num_common / 2;
  const bool train = mode == SampleMode::kTrain;

  // --- query class and how many copies of its block the context holds ---
  const QueryPlan plan = PlanQueries(cfg_, npairs, B, mode, gen);
  const torch::Tensor& rare_query = plan.rare_query;
  const int64_t copies = plan.copies;
  const double dist_rare = plan.dist_rare;

  // Rare slots per sequence: 0,1 for the query pair (or 0 for a fresh
  // re-pairing/variant token), then 2+2j, 3+2j for distractor j.
  torch::Tensor rslots = RowPermutations(B, cfg_.num_rare, 2 * n + 2, gen) + rare_begin();

  // --- common query pair, orientation ---
  torch::Tensor qpair = torch::zeros({B}, kI64);
  torch::Tensor a_common = torch::zeros({B}, kI64), partner = torch::zeros({B}, kI64);
  if (npairs > 0) {
    qpair = torch::multinomial(torch::softmax(pair_log_w_, 0), B, /*replacement=*/true, gen);
    torch::Tensor orient = Coin({B}, 0.5, gen).to(torch::kLong);
    a_common = pairs_.index({qpair, orient});
    partner = pairs_.index({qpair, 1 - orient});
  }
  torch::Tensor varied = torch::zeros({B}, torch::kBool);
  if (train && npairs > 0) varied = Coin({B}, cfg_.variability, gen).logical_and(rare_query.logical_not());

  torch::Tensor key, value, kind;
  torch::Tensor rkey = rslots.select(1, 0), rval = rslots.select(1, 1);
  if (cfg_.variant_mode) {
    key = torch::where(varied, rkey, a_common);
    value = partner;
  } else {
    key = a_common;
    value = torch::where(varied, rkey, partner);
  }
  key = torch::where(rare_query, rkey, key);
  value = torch::where(rare_query, rval, value);
  kind = torch::where(rare_query, torch::full({B}, int64_t{kQueryRare}, kI64),
                      torch::where(varied, torch::full({B}, int64_t{kQueryCommonVaried}, kI64),
                                   torch::full({B}, int64_t{kQueryCommonCanon}, kI64)));
  torch::Tensor alt = value;

  // Pairs a common distractor must not use.
  torch::Tensor excluded;
  if (npairs > 0) {
    excluded = torch::zeros({B, npairs}, torch::kBool);
    excluded.scatter_(1, qpair.unsqueeze(1), rare_query.logical_not().unsqueeze(1));
  }

  if (mode == SampleMode::kIclHoldout) {
    torch::Tensor h = RowPermutations(B, cfg_.num_heldout, 2, gen) + heldout_begin();
    key = h.select(1, 0);
    value = h.select(1, 1);
    alt = value;
    kind = torch::full({B}, int64_t{kQueryHoldout}, kI64);
  } else if (mode == SampleMode::kConflict) {
    // x: a member of another common pair (Zipf-weighted), in context as [a x].
    torch::Tensor logits = pair_log_w_.unsqueeze(0).expand({B, npairs}).clone();
    logits.masked_fill_(excluded, -std::numeric_limits<double>::infinity());
    torch::Tensor xpair = torch::multinomial(torch::softmax(logits, 1), 1, false, gen).squeeze(1);
    torch::Tensor xorient = Coin({B}, 0.5, gen).to(torch::kLong);
    value = pairs_.index({xpair, xorient});
    alt = partner;
    excluded.scatter_(1, xpair.unsqueeze(1), true);
  }

  // --- distractors: rare w.p. dist_rare, else an unused common pair drawn by
  // Zipf weight without replacement (Gumbel top-k); a common distractor that
  // finds no unused pair becomes rare ---
  torch::Tensor slot = torch::arange(n, kI64).unsqueeze(0).expand({B, n});
  torch::Tensor is_distractor = slot >= copies;
  torch::Tensor rare_pairs = rslots.narrow(1, 2, 2 * n).view({B, n, 2});
  torch::Tensor dkey = rare_pairs.select(2, 0), dval = rare_pairs.select(2, 1);
  torch::Tensor want_common = Coin({B, n}, 1.0 - dist_rare, gen).logical_and(is_distractor);
  if (npairs > 0) CommonDistractors(pair_log_w_, pairs_, want_common, excluded, gen, &dkey, &dval);
  torch::Tensor bkey = torch::where(is_distractor, dkey, key.unsqueeze(1));
  torch::Tensor bval = torch::where(is_distractor, dval, value.unsqueeze(1));

  // --- shuffle the blocks ---
  torch::Tensor perm = torch::rand({B, n}, gen, kF64).argsort(/*dim=*/1, /*descending=*/false);
  bkey = bkey.gather(1, perm);
  bval = bval.gather(1, perm);

  Batch out = Layout(cfg_, T, bkey, bval, key, gen);
  out.target = value;
  out.alt_target = alt;
  out.query_kind = kind;
  return out;
}

TaskSymmetry AssocRecallTask::Symmetry() const {
  TaskSymmetry s = AssocRecallSymmetry(cfg_.num_common, cfg_.num_rare, cfg_.num_heldout, cfg_.block_length,
                                       num_positions(), cfg_.absolute_positions);
  s.partner.assign(partner_.data_ptr<int64_t>(), partner_.data_ptr<int64_t>() + vocab_);
  return s;
}

std::vector<EvalSetInfo> AssocRecallTask::EvalSets() const {
  const AssocRecallTask& task = *this;
  std::vector<EvalSetInfo> sets;
  const std::pair<SampleMode, const char*> all[] = {{SampleMode::kIclRare, "icl_rare"},
                                                    {SampleMode::kIclHoldout, "icl_holdout"},
                                                    {SampleMode::kIwl, "iwl"},
                                                    {SampleMode::kConflict, "conflict"},
                                                    {SampleMode::kTrain, "train_mix"}};
  for (const auto& [mode, name] : all) {
    if (task.Supports(mode)) sets.push_back({mode, name, ""});
  }
  return sets;
}

}  // namespace circuitlab::engine
