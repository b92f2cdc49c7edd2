// The block-list generators other than associative recall (SCIENCE.md
// A.1.2-A.1.7) and the task factory. Layouts and symmetry groups are declared
// in tasks/catalog.cc; each generator here only draws sequences.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "server/engine/tasks/assoc_recall.h"
#include "server/engine/tasks/block_task.h"
#include "server/engine/torch_util.h"

namespace circuitlab::engine {
namespace {

using torch::indexing::Slice;

torch::Tensor Arange(int64_t b, int64_t t) { return torch::arange(t, kI64).unsqueeze(0).expand({b, t}).contiguous(); }

// The common part of every task here: spec-derived shape and symmetry, one
// evaluation set "test" of fresh training-distribution draws.
class CatalogTask : public BlockTask {
 public:
  explicit CatalogTask(const v1::ExperimentSpec& spec)
      : shape_(ShapeOf(spec)), symmetry_(DeclaredSymmetry(spec)) {}
  std::vector<EvalSetInfo> EvalSets() const override { return {{SampleMode::kTest, "test", ""}}; }
  TaskSymmetry Symmetry() const override { return symmetry_; }
  int64_t vocab_size() const override { return shape_.vocab; }
  int64_t num_positions() const override { return shape_.positions; }
  int64_t seq_len() const override { return shape_.seq_len; }

 protected:
  void CheckMode(SampleMode mode) const {
    if (mode != SampleMode::kTrain && mode != SampleMode::kTest) {
      throw std::invalid_argument("this task samples only the training distribution");
    }
  }
  // Position ids for a sequence of BOS + n blocks of k tokens + a query block
  // of kq tokens: absolute, or one uniform offset per block (BOS uniform).
  torch::Tensor BlockPids(int64_t B, int64_t n, int64_t k, int64_t kq, torch::Generator& gen) const {
    const int64_t T = shape_.seq_len, P = shape_.positions;
    if (!symmetry_.cyclic_positions) return Arange(B, T);
    torch::Tensor phi = torch::randint(0, P, {B, n + 1}, gen, kI64);
    torch::Tensor within = torch::arange(k, kI64);
    torch::Tensor blocks = (phi.narrow(1, 0, n).unsqueeze(2) + within).remainder(P).view({B, n * k});
    torch::Tensor query = (phi.narrow(1, n, 1) + torch::arange(kq, kI64)).remainder(P);
    torch::Tensor bos = torch::randint(0, P, {B, 1}, gen, kI64);
    return torch::cat({bos, blocks, query}, 1);
  }
  // Block index per position for that layout.
  torch::Tensor BlockOf(int64_t B, int64_t n, int64_t k, int64_t kq) const {
    torch::Tensor blocks = torch::arange(n, kI64).repeat_interleave(k);
    torch::Tensor row = torch::cat({torch::full({1}, -1, kI64), blocks, torch::full({kq}, n, kI64)});
    return row.unsqueeze(0).expand({B, row.size(0)}).contiguous();
  }
  static Batch Make(torch::Tensor tokens, torch::Tensor pids, torch::Tensor target, torch::Tensor block_of) {
    Batch b;
    const int64_t B = tokens.size(0);
    b.tokens = std::move(tokens);
    b.pids = std::move(pids);
    b.alt_target = target;
    b.target = std::move(target);
    b.query_kind = torch::zeros({B}, kI64);
    b.block_of_token = std::move(block_of);
    return b;
  }

  TaskShape shape_;
  TaskSymmetry symmetry_;
};

// A.1.2 in block-list form: chain [u0 u1] ... [u_{k-1} u_k] among distractor
// pairs, query [u0] -> u_k; alt_target = u1 (the 1-hop shortcut).
class KHopTask : public CatalogTask {
 public:
  explicit KHopTask(const v1::ExperimentSpec& spec) : CatalogTask(spec), t_(spec.task().k_hop()) {}
  std::vector<EvalSetInfo> EvalSets() const override { return {{SampleMode::kTest, "test", "shortcut"}}; }
  Batch Sample(int64_t B, SampleMode mode, torch::Generator& gen) const override {
    CheckMode(mode);
    const int64_t n = t_.num_blocks(), k = t_.hops();
    torch::Tensor tok = RowPermutations(B, t_.num_tokens(), 2 * n - k + 1, gen) + kNumSpecials;
    torch::Tensor chain = tok.narrow(1, 0, k + 1);                                    // u0..uk
    torch::Tensor firsts = chain.narrow(1, 0, k), seconds = chain.narrow(1, 1, k);
    if (n > k) {
      torch::Tensor d = tok.narrow(1, k + 1, 2 * (n - k)).view({B, n - k, 2});
      firsts = torch::cat({firsts, d.select(2, 0)}, 1);
      seconds = torch::cat({seconds, d.select(2, 1)}, 1);
    }
    torch::Tensor order = RowPermutations(B, n, n, gen);
    torch::Tensor blocks = torch::stack({firsts.gather(1, order), seconds.gather(1, order)}, 2).view({B, 2 * n});
    torch::Tensor tokens = torch::cat({torch::full({B, 1}, kFill, kI64), blocks, chain.narrow(1, 0, 1)}, 1);
    Batch b = Make(tokens, BlockPids(B, n, 2, 1, gen), chain.select(1, k), BlockOf(B, n, 2, 1));
    b.alt_target = chain.select(1, 1);
    return b;
  }

 private:
  v1::KHopTask t_;
};

// A.1.3: a fresh order-(n-1) Markov chain per sequence (rows ~ Dirichlet(1)),
// uniform start; the target is the next letter after the sequence. The Bayes
// predictor is the Dirichlet(1) posterior predictive from in-context counts.
class NGramTask : public CatalogTask {
 public:
  explicit NGramTask(const v1::ExperimentSpec& spec) : CatalogTask(spec), t_(spec.task().ngram()) {}
  Batch Sample(int64_t B, SampleMode mode, torch::Generator& gen) const override {
    CheckMode(mode);
    const int64_t S = t_.alphabet(), ctx = t_.order() - 1, L = t_.length();
    int64_t rows = 1;
    for (int64_t i = 0; i < ctx; ++i) rows *= S;
    // Dirichlet(1) rows: normalised Exp(1) draws.
    torch::Tensor table = -torch::log(torch::rand({B, rows, S}, gen, kF64).clamp_min(1e-300));
    table = table / table.sum(-1, true);
    torch::Tensor seq = torch::empty({B, L + 1}, kI64);  // letters 0..S-1; the last one is the target
    seq.narrow(1, 0, ctx).copy_(torch::randint(0, S, {B, ctx}, gen, kI64));
    torch::Tensor counts = torch::zeros({B, rows, S}, kF64);
    torch::Tensor batch_idx = torch::arange(B, kI64);
    torch::Tensor bayes;
    for (int64_t i = ctx; i <= L; ++i) {
      torch::Tensor state = torch::zeros({B}, kI64);
      for (int64_t j = i - ctx; j < i; ++j) state = state * S + seq.select(1, j);
      torch::Tensor probs = table.index({batch_idx, state});                        // [B, S]
      torch::Tensor next = torch::multinomial(probs, 1, /*replacement=*/true, gen).squeeze(1);
      seq.select(1, i).copy_(next);
      if (i < L) counts.index_put_({batch_idx, state, next}, torch::ones({B}, kF64), /*accumulate=*/true);
      if (i == L) {
        // Posterior predictive for the final context, from the transitions
        // seen inside the sequence.
        torch::Tensor c = counts.index({batch_idx, state});                       // [B, S]
        torch::Tensor pred = (c + 1.0) / (c.sum(-1, true) + static_cast<double>(S));
        bayes = torch::full({B, shape_.vocab}, -std::numeric_limits<double>::infinity(), kF64);
        bayes.narrow(1, kNumSpecials, S).copy_(pred.log());
      }
    }
    torch::Tensor letters = seq.narrow(1, 0, L) + kNumSpecials;
    torch::Tensor tokens = torch::cat({torch::full({B, 1}, kFill, kI64), letters}, 1);
    torch::Tensor block_of = torch::cat({torch::full({B, 1}, -1, kI64), Arange(B, L)}, 1);
    Batch b = Make(tokens, Arange(B, L + 1), seq.select(1, L) + kNumSpecials, block_of);
    b.bayes_logp = bayes;
    return b;
  }

 private:
  v1::NGramTask t_;
};

// A.1.4: BOS, front padding, A B, fillers, SEP S GIVE; target = the name != S.
class IoiTask : public CatalogTask {
 public:
  explicit IoiTask(const v1::ExperimentSpec& spec) : CatalogTask(spec), t_(spec.task().ioi()) {}
  Batch Sample(int64_t B, SampleMode mode, torch::Generator& gen) const override {
    CheckMode(mode);
    const int64_t F = t_.max_fillers(), T = shape_.seq_len;
    torch::Tensor names = RowPermutations(B, t_.num_names(), 2, gen) + kNumSpecials;
    torch::Tensor s_is_a = Coin({B}, 0.5, gen);
    torch::Tensor a = names.select(1, 0), bname = names.select(1, 1);
    torch::Tensor subject = torch::where(s_is_a, a, bname), target = torch::where(s_is_a, bname, a);
    torch::Tensor fill = F > 0 ? torch::randint(0, F + 1, {B}, gen, kI64) : torch::zeros({B}, kI64);
    torch::Tensor start = 1 + (F - fill);  // position of A
    torch::Tensor tokens = torch::full({B, T}, kFill, kI64);
    tokens.scatter_(1, start.unsqueeze(1), a.unsqueeze(1));
    tokens.scatter_(1, (start + 1).unsqueeze(1), bname.unsqueeze(1));
    tokens.index_put_({Slice(), T - 3}, kSep);
    tokens.index_put_({Slice(), T - 2}, subject);
    tokens.index_put_({Slice(), T - 1}, kGive);
    torch::Tensor block_of = torch::full({B, T}, -1, kI64);
    block_of.scatter_(1, start.unsqueeze(1), 0);
    block_of.scatter_(1, (start + 1).unsqueeze(1), 0);
    block_of.index_put_({Slice(), Slice(T - 3, T)}, 1);
    return Make(tokens, Arange(B, T), target, block_of);
  }

 private:
  v1::IoiTask t_;
};

// A.1.5: blocks [tag key value]; each key under tags_per_key distinct tags
// with distinct values; query [tag key] -> value.
class ConditionalRetrievalTask : public CatalogTask {
 public:
  explicit ConditionalRetrievalTask(const v1::ExperimentSpec& spec)
      : CatalogTask(spec), t_(spec.task().conditional_retrieval()) {}
  Batch Sample(int64_t B, SampleMode mode, torch::Generator& gen) const override {
    CheckMode(mode);
    const int64_t n = t_.num_blocks(), per = t_.tags_per_key(), keys = n / per;
    const int64_t tok_begin = kNumSpecials + t_.num_tags();
    torch::Tensor kv = RowPermutations(B, t_.num_tokens(), keys + n, gen) + tok_begin;
    torch::Tensor key = kv.narrow(1, 0, keys).repeat_interleave(per, 1);           // [B, n]
    torch::Tensor value = kv.narrow(1, keys, n);                                    // [B, n]
    torch::Tensor tag = (RowPermutations(B * keys, t_.num_tags(), per, gen) + kNumSpecials).view({B, n});
    torch::Tensor order = RowPermutations(B, n, n, gen);
    tag = tag.gather(1, order);
    key = key.gather(1, order);
    value = value.gather(1, order);
    torch::Tensor q = torch::randint(0, n, {B, 1}, gen, kI64);
    torch::Tensor blocks = torch::stack({tag, key, value}, 2).view({B, 3 * n});
    torch::Tensor tokens =
        torch::cat({torch::full({B, 1}, kFill, kI64), blocks, tag.gather(1, q), key.gather(1, q)}, 1);
    return Make(tokens, BlockPids(B, n, 3, 2, gen), value.gather(1, q).squeeze(1), BlockOf(B, n, 3, 2));
  }

 private:
  v1::ConditionalRetrievalTask t_;
};

// A.1.6: a random bijection pi per sequence; blocks [a pi(a)]; query [pi(a)] -> a.
class PermutationInversionTask : public CatalogTask {
 public:
  explicit PermutationInversionTask(const v1::ExperimentSpec& spec)
      : CatalogTask(spec), t_(spec.task().permutation_inversion()) {}
  Batch Sample(int64_t B, SampleMode mode, torch::Generator& gen) const override {
    CheckMode(mode);
    const int64_t n = t_.num_blocks(), V = t_.num_tokens();
    torch::Tensor pi = RowPermutations(B, V, V, gen);                    // pi[b, a]
    torch::Tensor a = RowPermutations(B, V, n, gen);                     // distinct a per sequence
    torch::Tensor pa = pi.gather(1, a);
    torch::Tensor q = torch::randint(0, n, {B, 1}, gen, kI64);
    torch::Tensor blocks = torch::stack({a, pa}, 2).view({B, 2 * n}) + kNumSpecials;
    torch::Tensor tokens = torch::cat({torch::full({B, 1}, kFill, kI64), blocks, pa.gather(1, q) + kNumSpecials}, 1);
    return Make(tokens, BlockPids(B, n, 2, 1, gen), a.gather(1, q).squeeze(1) + kNumSpecials, BlockOf(B, n, 2, 1));
  }

 private:
  v1::PermutationInversionTask t_;
};

// A.1.7: BOS x_1 y_1 ... x_N y_N x_q -> y_q, absolute positions.
class MinimalIclTask : public CatalogTask {
 public:
  explicit MinimalIclTask(const v1::ExperimentSpec& spec) : CatalogTask(spec), t_(spec.task().minimal_icl()) {}
  Batch Sample(int64_t B, SampleMode mode, torch::Generator& gen) const override {
    CheckMode(mode);
    const int64_t N = t_.num_pairs();
    torch::Tensor x = RowPermutations(B, t_.num_items(), N, gen) + kNumSpecials;
    torch::Tensor y = RowPermutations(B, t_.num_labels(), N, gen) + (kNumSpecials + int64_t{t_.num_items()});
    torch::Tensor j = torch::randint(0, N, {B, 1}, gen, kI64);
    torch::Tensor pairs = torch::stack({x, y}, 2).view({B, 2 * N});
    torch::Tensor tokens = torch::cat({torch::full({B, 1}, kFill, kI64), pairs, x.gather(1, j)}, 1);
    return Make(tokens, Arange(B, 2 * N + 2), y.gather(1, j).squeeze(1), BlockOf(B, N, 2, 1));
  }

 private:
  v1::MinimalIclTask t_;
};

}  // namespace

torch::Tensor RowPermutations(int64_t batch, int64_t n, int64_t take, torch::Generator& gen) {
  return torch::rand({batch, n}, gen, kF64).argsort(/*dim=*/1, /*descending=*/false).narrow(1, 0, take);
}

torch::Tensor Coin(torch::IntArrayRef shape, double p, torch::Generator& gen) {
  if (p <= 0.0) return torch::zeros(shape, torch::kBool);
  if (p >= 1.0) return torch::ones(shape, torch::kBool);
  return torch::rand(shape, gen, kF64) < p;
}

std::unique_ptr<BlockTask> MakeBlockTask(const v1::ExperimentSpec& spec, uint64_t pool_seed) {
  switch (spec.task().kind_case()) {
    case v1::TaskSpec::kKHop: return std::make_unique<KHopTask>(spec);
    case v1::TaskSpec::kNgram: return std::make_unique<NGramTask>(spec);
    case v1::TaskSpec::kIoi: return std::make_unique<IoiTask>(spec);
    case v1::TaskSpec::kConditionalRetrieval: return std::make_unique<ConditionalRetrievalTask>(spec);
    case v1::TaskSpec::kPermutationInversion: return std::make_unique<PermutationInversionTask>(spec);
    case v1::TaskSpec::kMinimalIcl: return std::make_unique<MinimalIclTask>(spec);
    default: return std::make_unique<AssocRecallTask>(AssocRecallConfig::FromSpec(spec), pool_seed);
  }
}

}  // namespace circuitlab::engine
