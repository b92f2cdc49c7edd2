#include "server/engine/train/batch_split.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "server/engine/torch_util.h"

namespace circuitlab::engine {
namespace {

std::mutex blas_mu;
int blas_single = 0;  // BlasSingleThreaded objects alive

// The helper threads of one calling thread (a run's), kept between steps: a
// thread made anew each step paid for its first touches of memory every
// step (OpenBLAS's per-thread packing buffers, a fresh malloc arena), ~16% of
// a B.2 step in page faults (bench/RESULTS.md). They end with the calling
// thread.
class SliceHelpers {
 public:
  ~SliceHelpers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // fn(1) .. fn(n - 1) on the helpers, fn(0) on the caller; returns when all
  // returned (fn must not throw).
  void Run(int n, const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int>(threads_.size()) < n - 1) {
        const int part = static_cast<int>(threads_.size()) + 1;
        threads_.emplace_back([this, part] { Loop(part); });
      }
      job_ = &fn;
      parts_ = n;
      pending_ = n - 1;
      ++generation_;
    }
    wake_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void Loop(int part) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (part >= parts_) continue;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      (*job)(part);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int parts_ = 0, pending_ = 0;
  bool stop_ = false;
};

}  // namespace

BlasSingleThreaded::BlasSingleThreaded(int restore) : restore_(restore) {
  std::lock_guard<std::mutex> lock(blas_mu);
  if (blas_single++ == 0) SetBlasThreads(1);
}

BlasSingleThreaded::~BlasSingleThreaded() {
  std::lock_guard<std::mutex> lock(blas_mu);
  if (--blas_single == 0) SetBlasThreads(restore_);
}

std::pair<int64_t, int64_t> SliceOf(int64_t rows, int parts, int part) {
  const int64_t base = rows / parts, extra = rows % parts;
  const int64_t lo = part * base + std::min<int64_t>(part, extra);
  return {lo, base + (part < extra ? 1 : 0)};
}

PartOutput BackwardInParts(int parts, int64_t rows, const std::vector<torch::Tensor>& params, const PartLoss& loss_of) {
  if (parts <= 1 || rows < 2) {
    PartOutput out = loss_of(0, rows);
    out.loss.sum().backward();
    out.loss = out.loss.detach();
    return out;
  }
  const int n = static_cast<int>(std::min<int64_t>(parts, rows));
  std::vector<PartOutput> outs(static_cast<size_t>(n));
  std::vector<std::vector<torch::Tensor>> grads(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  const std::function<void(int)> run = [&](int part) {
    try {
      at::set_num_threads(1);  // this thread's LibTorch ops: the parallelism is the split
      const auto [lo, count] = SliceOf(rows, n, part);
      PartOutput out = loss_of(lo, count);
      const double weight = static_cast<double>(count) / static_cast<double>(rows);
      grads[part] = torch::autograd::grad({out.loss.sum() * weight}, params, /*grad_outputs=*/{},
                                          /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
      out.loss = out.loss.detach() * weight;
      for (auto& [name, value] : out.extra) value = value * weight;
      outs[part] = std::move(out);
    } catch (...) {
      errors[part] = std::current_exception();
    }
  };
  thread_local SliceHelpers helpers;
  helpers.Run(n, run);
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  torch::NoGradGuard no_grad;
  PartOutput total = std::move(outs[0]);
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor sum;
    bool owned = false;  // `sum` is a tensor of our own (autograd's gradients may be views)
    for (int part = 0; part < n; ++part) {
      const torch::Tensor& g = grads[part][i];
      if (!g.defined()) continue;
      if (!sum.defined()) {
        sum = g;
      } else if (!owned) {
        sum = sum + g;
        owned = true;
      } else {
        sum.add_(g);
      }
    }
    if (sum.defined() && !owned) sum = sum.clone();
    torch::Tensor p = params[i];
    p.mutable_grad() = sum.defined() ? sum : torch::zeros_like(p);
  }
  for (int part = 1; part < n; ++part) {
    total.loss = total.loss + outs[part].loss;
    for (size_t k = 0; k < total.extra.size(); ++k) {
      total.extra[k].second = total.extra[k].second + outs[part].extra[k].second;
    }
  }
  return total;
}

}  // namespace circuitlab::engine
