// circuitlab: the command-line client. A thin layer over client::Client:
// parse flags, call, print (human tables by default, --json for scripts).
//
// Exit codes: 0 success; 1 the watched run ended FAILED or CANCELLED; 2 bad
// usage or spec file; 10 + gRPC status code for an RPC error (e.g. 13
// INVALID_ARGUMENT, 15 NOT_FOUND, 18 RESOURCE_EXHAUSTED, 24 UNAVAILABLE);
// 130 watching stopped by Ctrl-C (the run goes on).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/lib/client.h"
#include "client/lib/sweep_render.h"
#include "client/lib/task_vector_render.h"

namespace {

using circuitlab::client::Client;
using circuitlab::client::ClientOptions;
namespace v1 = circuitlab::v1;

std::atomic<bool> g_interrupted{false};
extern "C" void OnSigint(int) { g_interrupted.store(true); }

struct Globals {
  std::string server = "127.0.0.1:50051";
  double timeout_s = 30;
  bool json = false;
  std::string token_file;
};

int ExitCodeFor(const absl::Status& s) { return s.ok() ? 0 : 10 + static_cast<int>(s.code()); }

int ReportError(const absl::Status& s) {
  std::cerr << "error: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  if (s.code() == absl::StatusCode::kUnavailable) {
    std::cerr << "hint: is circuitlab-server running and reachable at the --server address?\n";
  }
  return ExitCodeFor(s);
}

std::string StateName(v1::RunState s) {
  std::string name = v1::RunState_Name(s);
  const std::string prefix = "RUN_STATE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return name;
}

v1::RunState ParseState(const std::string& text) {
  std::string up = text;
  std::transform(up.begin(), up.end(), up.begin(), ::toupper);
  v1::RunState s;
  if (v1::RunState_Parse("RUN_STATE_" + up, &s) || v1::RunState_Parse(up, &s)) return s;
  throw CLI::ValidationError("--state", "unknown state '" + text + "' (queued|running|succeeded|failed|cancelled)");
}

// Splits comma-separated lists, keeping commas inside () and [] (coordinate
// labels such as "OUT:[(0,1,0)]:I" hold them).
std::vector<std::string> SplitList(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& item : items) {
    int depth = 0;
    std::string cur;
    for (char c : item) {
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if (c == ',' && depth == 0) {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

// A spec file (checked without a run) or a run id.
template <typename Request>
absl::Status SetTarget(const std::string& target, Request* req) {
  if (!std::filesystem::exists(target)) {
    req->set_run_id(target);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ExperimentSpec> spec = circuitlab::client::ReadSpecFile(target);
  if (!spec.ok()) return spec.status();
  *req->mutable_spec() = *spec;
  return absl::OkStatus();
}

bool IsFinal(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED;
}

std::string FormatTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  std::time_t secs = t.seconds();
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::localtime(&secs));
  return buf;
}

std::string Fixed(double v, int digits = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Left-aligns to `width` terminal columns (labels contain multi-byte "∅→").
std::string Pad(const std::string& s, size_t width) {
  size_t columns = 0;
  for (unsigned char c : s) columns += (c & 0xC0) != 0x80;
  return columns >= width ? s : s + std::string(width - columns, ' ');
}

std::string Duration(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return "-";
  long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  }
  return buf;
}

void PrintRunDetails(const v1::Run& run) {
  const v1::Progress& p = run.progress();
  std::cout << "run        " << run.run_id() << "  " << run.name() << "\n"
            << "state      " << StateName(run.state()) << (run.device().empty() ? "" : "  on " + run.device())
            << "  attempts " << run.attempts() << "\n"
            << "progress   step " << p.step() << "/" << p.total_steps();
  if (p.steps_per_second() > 0) std::cout << "  " << Fixed(p.steps_per_second(), 1) << " steps/s";
  std::cout << "  checkpoint at step " << run.checkpoint_step() << "\n"
            << "created    " << FormatTime(run.created_at()) << "  started " << FormatTime(run.started_at())
            << "  finished " << FormatTime(run.finished_at()) << "\n";
  if (run.tags_size() > 0) {
    std::cout << "tags      ";
    for (const auto& t : run.tags()) std::cout << " " << t;
    std::cout << "\n";
  }
  if (!run.error().empty()) std::cout << "error      " << run.error() << "\n";
  if (!p.latest().empty()) {
    std::cout << "latest metrics:\n";
    for (const auto& [name, value] : std::map<std::string, double>(p.latest().begin(), p.latest().end())) {
      std::printf("  %-32s %.4f\n", name.c_str(), value);
    }
  }
}

// Renders progress events: a live bar on a terminal, a line every few
// seconds otherwise.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool json) : json_(json), tty_(isatty(STDERR_FILENO)) {}

  void OnEvent(const v1::RunEvent& ev) {
    if (json_) {
      std::cout << circuitlab::client::ToJson(ev, false) << "\n" << std::flush;
      return;
    }
    if (ev.has_snapshot()) {
      const v1::Run& run = ev.snapshot();
      total_ = run.progress().total_steps();
      run_id_ = run.run_id();
      if (!announced_) {
        std::cerr << "watching " << run.run_id() << " (" << run.name() << "): " << StateName(run.state()) << "\n";
        announced_ = true;
      }
      latest_.insert(run.progress().latest().begin(), run.progress().latest().end());
      Draw(run.progress().step(), run.progress().steps_per_second(), run.progress().eta_seconds());
      state_ = run.state();
      error_ = run.error();
    } else if (ev.has_progress()) {
      const v1::Progress& p = ev.progress();
      if (p.total_steps() > 0) total_ = p.total_steps();
      for (const auto& [k, v] : p.latest()) latest_[k] = v;
      Draw(p.step(), p.steps_per_second(), p.eta_seconds());
    } else if (ev.has_metrics()) {
      for (const auto& pt : ev.metrics().points()) latest_[pt.name()] = pt.value();
    } else if (ev.has_state()) {
      state_ = ev.state().state();
      error_ = ev.state().error();
      EndLine();
      std::cerr << run_id_ << ": " << StateName(state_) << (ev.state().device().empty() ? "" : " on " + ev.state().device())
                << (error_.empty() ? "" : " (" + error_ + ")") << "\n";
    }
  }

  void EndLine() {
    if (drawn_ && tty_) std::cerr << "\n";
    drawn_ = false;
  }

  v1::RunState state() const { return state_; }
  const std::string& error() const { return error_; }
  const std::map<std::string, double>& latest() const { return latest_; }

 private:
  std::string Get(const std::string& key) const {
    auto it = latest_.find(key);
    return it == latest_.end() ? "-" : Fixed(it->second);
  }

  void Draw(uint64_t step, double rate, double eta) {
    const double frac = total_ > 0 ? static_cast<double>(step) / static_cast<double>(total_) : 0.0;
    const int width = 24;
    const int filled = static_cast<int>(std::round(frac * width));
    std::ostringstream line;
    line << "[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << std::setw(3)
         << static_cast<int>(std::round(frac * 100)) << "%  step " << step << "/" << total_ << "  loss "
         << Get("train/loss") << "  icl " << Get("eval/icl_rare/accuracy") << "  iwl " << Get("eval/iwl/accuracy")
         << "  " << Fixed(rate, 1) << " it/s  eta " << Duration(eta);
    if (tty_) {
      std::cerr << "\r" << line.str() << "\033[K" << std::flush;
      drawn_ = true;
    } else {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_line_ >= std::chrono::seconds(2) || step == total_) {
        std::cerr << line.str() << "\n";
        last_line_ = now;
      }
    }
  }

  bool json_;
  bool tty_;
  bool drawn_ = false;
  bool announced_ = false;
  uint64_t total_ = 0;
  std::string run_id_;
  v1::RunState state_ = v1::RUN_STATE_UNSPECIFIED;
  std::string error_;
  std::map<std::string, double> latest_;
  std::chrono::steady_clock::time_point last_line_{};
};

int DoWatch(Client& client, const std::string& run_id, bool json) {
  ProgressPrinter printer(json);
  v1::WatchRunRequest req;
  req.set_run_id(run_id);
  req.set_include_metrics(true);
  std::signal(SIGINT, OnSigint);
  absl::Status s = client.Watch(req, [&](const v1::RunEvent& ev) { printer.OnEvent(ev); }, g_interrupted);
  std::signal(SIGINT, SIG_DFL);
  printer.EndLine();
  if (absl::IsCancelled(s) && g_interrupted.load()) {
    std::cerr << "stopped watching; " << run_id << " goes on (circuitlab cancel " << run_id << " stops it)\n";
    return 130;
  }
  if (!s.ok()) return ReportError(s);
  if (!json && IsFinal(printer.state())) {
    const auto& latest = printer.latest();
    std::cout << run_id << " " << StateName(printer.state()) << "\n";
    for (const auto& [name, value] : latest) std::printf("  %-32s %.4f\n", name.c_str(), value);
  }
  return printer.state() == v1::RUN_STATE_SUCCEEDED ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "circuitlab: submit, watch and query experiments on a circuitlab-server.\n\n"
      "Exit codes: 0 ok; 1 the watched run FAILED/was CANCELLED; 2 bad usage or spec; 10+code for a\n"
      "gRPC error (13 INVALID_ARGUMENT, 15 NOT_FOUND, 18 RESOURCE_EXHAUSTED, 24 UNAVAILABLE);\n"
      "130 watching stopped by Ctrl-C (the run goes on).",
      "circuitlab"};
  app.require_subcommand(1);
  Globals g;
  app.add_option("--server", g.server, "Server address host:port")->capture_default_str();
  app.add_option("--timeout", g.timeout_s, "Deadline of each call, in seconds")->capture_default_str();
  app.add_flag("--json", g.json, "Machine-readable output (protobuf JSON)");
  app.add_option("--token-file", g.token_file, "File with the server's bearer token (first line)")
      ->check(CLI::ExistingFile);

  // submit
  std::string spec_file;
  bool submit_watch = false;
  auto* submit = app.add_subcommand("submit",
                                    "Submit an experiment spec (protobuf JSON) as a new run.\n"
                                    "  circuitlab submit examples/induction.json --watch");
  submit->add_option("FILE", spec_file, "ExperimentSpec JSON file")->required()->check(CLI::ExistingFile);
  submit->add_flag("--watch,-w", submit_watch, "Watch the run until it ends");

  // ls
  std::vector<std::string> ls_states, ls_tags;
  int ls_limit = 50;
  std::string ls_page;
  auto* ls = app.add_subcommand("ls", "List runs, newest first.\n  circuitlab ls --state running --tag demo");
  ls->add_option("--state", ls_states, "Only runs in this state (repeatable): queued|running|succeeded|failed|cancelled");
  ls->add_option("--tag", ls_tags, "Only runs with this tag (repeatable; all must match)");
  ls->add_option("--limit", ls_limit, "Runs per page (1-1000)")->capture_default_str()->check(CLI::Range(1, 1000));
  ls->add_option("--page-token", ls_page, "Continue from a previous page");

  // show / watch / cancel
  std::string run_id;
  auto* show = app.add_subcommand("show", "Show one run: state, progress, latest metrics.\n  circuitlab show r3");
  show->add_option("RUN", run_id, "Run id, e.g. r3")->required();
  auto* watch = app.add_subcommand("watch",
                                   "Follow a run live: progress bar with step, loss, ICL/IWL accuracy.\n"
                                   "Ctrl-C stops watching, not the run.\n  circuitlab watch r3");
  watch->add_option("RUN", run_id, "Run id")->required();
  bool cancel_wait = false;
  auto* cancel = app.add_subcommand("cancel", "Cancel a queued or running run.\n  circuitlab cancel r3 --wait");
  cancel->add_option("RUN", run_id, "Run id")->required();
  cancel->add_flag("--wait", cancel_wait, "Wait (up to --timeout) until the run has stopped");

  // metrics
  std::vector<std::string> m_names;
  uint64_t m_min = 0, m_max = 0;
  uint32_t m_points = 0;
  bool m_csv = false;
  auto* metrics = app.add_subcommand("metrics",
                                     "Metric series of a run (train/loss, eval/<set>/accuracy, ...).\n"
                                     "  circuitlab metrics r3 --name eval/icl_rare/accuracy --csv > icl.csv");
  metrics->add_option("RUN", run_id, "Run id")->required();
  metrics->add_option("--name,--names", m_names, "Only these series (repeatable, or comma-separated)")->delimiter(',');
  metrics->add_option("--min-step", m_min, "First step (inclusive)");
  metrics->add_option("--max-step", m_max, "Last step (inclusive; 0 = no bound)");
  metrics->add_option("--max-points", m_points, "Downsample each series to at most this many points");
  metrics->add_flag("--csv", m_csv, "CSV: run_id,name,step,value");

  // coords / project
  std::vector<std::string> c_names;
  bool c_complete = false, c_csv = false, c_all = false, p_force = false;
  uint64_t c_min = 0, c_max = 0, p_step = 0;
  uint32_t c_points = 0;
  auto* coords = app.add_subcommand(
      "coords",
      "IMIR coordinates over training (recorded every recording.coordinates_every steps).\n"
      "Names are labels (L2H1:[∅→(1,0)]:I_t) or canonical names (alpha, beta, gamma, delta).\n"
      "  circuitlab coords r3 --name alpha --name beta --name gamma --csv > abc.csv");
  coords->add_option("RUN", run_id, "Run id")->required();
  coords->add_option("--name,--names", c_names, "Only these coordinates (repeatable, or comma-separated)");
  coords->add_flag("--complete", c_complete, "The complete set (needs recording.complete_coordinates)");
  coords->add_option("--min-step", c_min, "First step (inclusive)");
  coords->add_option("--max-step", c_max, "Last step (inclusive; 0 = no bound)");
  coords->add_option("--max-points", c_points, "Downsample each series to at most this many points");
  coords->add_flag("--csv", c_csv, "CSV: run_id,label,canonical,step,value");
  coords->add_flag("--all", c_all, "Show every coordinate (default: the 30 largest)");
  auto* project = app.add_subcommand(
      "project",
      "Project a stored checkpoint onto the IMIR basis: coordinates and off-manifold residual rho.\n"
      "  circuitlab project r3 --step 500 --complete");
  project->add_option("RUN", run_id, "Run id")->required();
  project->add_option("--step", p_step, "Checkpoint step (default: the newest)");
  project->add_flag("--complete", c_complete, "Project onto the complete set (the commutant)");
  project->add_flag("--force", p_force, "Recompute even if the answer is stored");
  project->add_flag("--all", c_all, "Show every coordinate (default: the 20 largest)");

  // invariance
  bool i_paper = false, i_controls = false, i_sgd = false;
  std::vector<uint64_t> i_samples;
  double i_std = 0;
  auto* invariance = app.add_subcommand(
      "invariance",
      "Theorem 1 numerically (SCIENCE.md C.6): at a random point of the span, does the expected gradient stay\n"
      "in it? Off-span fraction 1-f_N over a ladder of sample sizes, per matrix, with plateau and slope.\n"
      "Runs as a queued job on the server; this command waits and shows progress.\n"
      "  circuitlab invariance r3 --controls\n"
      "  circuitlab invariance examples/induction.json");
  invariance->add_option("TARGET", run_id,
                         "Run whose spec gives the task and model (r3), or a spec file (JSON) to check without a run")
      ->required();
  invariance->add_flag("--paper", i_paper, "Test the paper span instead of the complete one");
  invariance->add_flag("--controls", i_controls, "Also run the must-fail controls");
  invariance->add_flag("--sgd", i_sgd,
                       "Also the SGD corollary: rho after SGD from the point at batch 64/256/1024, plain and with "
                       "symmetrised minibatch gradients");
  invariance->add_option("--samples", i_samples, "Ladder of sample sizes (ascending)")->delimiter(',');
  invariance->add_option("--std", i_std, "Scale s of the random point's coordinates (default 1)");
  invariance->add_flag("--force", p_force, "Recompute even if stored");

  // sweeps
  std::string sweep_file, sweep_id;
  bool sw_watch = false;
  auto* sweep = app.add_subcommand(
      "sweep",
      "Submit a sweep: a base spec and axes (grid values, random ranges, seeds) expanded into runs under one\n"
      "sweep id. All members are validated first; none is queued if one is invalid.\n"
      "  circuitlab sweep examples/phase_diagram.json --watch");
  sweep->add_option("FILE", sweep_file, "Sweep spec (circuitlab.v1.SweepSpec as JSON)")->required()->check(CLI::ExistingFile);
  sweep->add_flag("--watch", sw_watch, "Wait for every member to end, showing progress");
  auto* sweep_show = app.add_subcommand("sweep-show", "Show a sweep: its members' states.\n  circuitlab sweep-show s1");
  sweep_show->add_option("SWEEP", sweep_id, "Sweep id, e.g. s1")->required();
  auto* sweep_cancel =
      app.add_subcommand("sweep-cancel", "Cancel every member of a sweep that has not ended.\n  circuitlab sweep-cancel s1");
  sweep_cancel->add_option("SWEEP", sweep_id, "Sweep id")->required();
  std::vector<std::string> ss_values, ss_filters, ss_pivot;
  std::string ss_value, ss_agg, ss_svg;
  bool ss_csv = false, ss_wait = false;
  auto* sweep_summary = app.add_subcommand(
      "sweep-summary",
      "One row per member: swept values and summary values; filter, export, pivot into a 2-D map.\n"
      "Value columns: a metric name (final value), coord:<name> (last recorded), first:<metric>>=<x> (first\n"
      "step reaching x), circuit / pair / pair_predicted (the run's circuit label, computed on demand).\n"
      "  circuitlab sweep-summary s1 --values eval/icl_rare/accuracy,pair --csv > s1.csv\n"
      "  circuitlab sweep-summary s1 --pivot a b --value pair --svg map.svg --wait");
  sweep_summary->add_option("SWEEP", sweep_id, "Sweep id")->required();
  sweep_summary->add_option("--values", ss_values, "Value columns (comma-separated)");
  sweep_summary->add_option("--filter", ss_filters, "Row filter column<op>value, op in = != < <= > >= (repeatable)");
  sweep_summary->add_option("--pivot", ss_pivot, "Pivot: the X and Y columns")->expected(2);
  sweep_summary->add_option("--value", ss_value, "Pivot: the value column (default: the first value column)");
  sweep_summary->add_option("--aggregate", ss_agg, "Pivot: mean (default), min, max or count");
  sweep_summary->add_flag("--csv", ss_csv, "Rows as CSV on stdout");
  sweep_summary->add_option("--svg", ss_svg, "Write the pivot as an SVG heatmap to this file");
  sweep_summary->add_flag("--wait", ss_wait, "Wait until on-demand cells (circuit labels) are computed");

  // circuits
  uint64_t d_step = 0;
  std::string d_set, d_metric, d_order;
  double d_tol = 0;
  uint32_t d_n = 0, d_evals = 0;
  auto* detect = app.add_subcommand(
      "detect",
      "Automatic circuit detection (SCIENCE.md D.1): project the checkpoint onto the IMIR basis, ablate\n"
      "coordinates greedily while the metric stays within --tolerance, and name the minimal circuit left:\n"
      "its coordinates, their roles (canonical / aiding / shortcut), the template recognised.\n"
      "  circuitlab detect r3\n  circuitlab detect r3 --metric loss --tolerance 0.05");
  detect->add_option("RUN", run_id, "Run id")->required();
  detect->add_option("--step", d_step, "Checkpoint step (default: the newest)");
  detect->add_option("--eval-set", d_set, "Evaluation set (default: icl_rare for recall, else test)");
  detect->add_option("--metric", d_metric, "accuracy (default), loss or p_target");
  detect->add_option("--tolerance", d_tol, "Allowed total degradation (default 0.01; 0.02 nats for loss)");
  detect->add_option("--order", d_order, "magnitude_asc (default), effect_asc or label");
  detect->add_option("--n-eval", d_n, "Sequences (default 2048)");
  detect->add_option("--max-evals", d_evals, "Budget of metric evaluations (default 5000)");
  detect->add_flag("--complete", c_complete, "FULL models: detect over the complete basis");
  detect->add_flag("--force", p_force, "Recompute even if stored");

  std::string iv_file;
  std::vector<std::string> iv_zero, iv_sets;
  std::vector<uint32_t> iv_heads;
  auto* intervene = app.add_subcommand(
      "intervene",
      "Apply interventions to a checkpoint and compare with the clean model on the same sequences: loss,\n"
      "accuracy, KL to the clean model, logit differences, per evaluation set. Interventions come from a\n"
      "JSON file (circuitlab.v1.InterveneRequest; run_id is filled in) or the quick flags.\n"
      "  circuitlab intervene r3 --zero beta\n"
      "  circuitlab intervene r3 --ablate-head 2\n"
      "  circuitlab intervene r3 --spec examples/ablate.json");
  intervene->add_option("RUN", run_id, "Run id")->required();
  intervene->add_option("--spec", iv_file, "InterveneRequest as JSON")->check(CLI::ExistingFile);
  intervene->add_option("--zero", iv_zero, "Zero these coordinates (labels or alpha/beta/gamma/delta)");
  intervene->add_option("--ablate-head", iv_heads, "Zero head 1 of these layers")->delimiter(',');
  intervene->add_option("--eval-sets", iv_sets, "Evaluation sets (default: all)")->delimiter(',');
  intervene->add_option("--step", d_step, "Checkpoint step (default: the newest)");
  intervene->add_option("--n-eval", d_n, "Sequences per set (default 2048)");
  intervene->add_flag("--force", p_force, "Recompute even if stored");

  auto* label = app.add_subcommand(
      "label",
      "ICL vs IWL (SCIENCE.md D.2) and the winning layer pair (D.3) at every stored checkpoint, and the\n"
      "run's label (ICL_ONLY, IWL_ONLY, BOTH_*, NEITHER, TRANSIENT_ICL).\n  circuitlab label r3");
  label->add_option("RUN", run_id, "Run id")->required();
  label->add_flag("--force", p_force, "Recompute even if stored");

  uint64_t dd_samples = 0;
  auto* data_dep = app.add_subcommand(
      "data-dependence",
      "Theorems 2 and 3 numerically (SCIENCE.md D.4): the gradient along alpha, beta, gamma, delta at the zero\n"
      "point over E.6's grid (common tokens suppress the ICL gradient by phi = f_r + (1 - f_r) f_v) and E.7's\n"
      "burstiness (dL/dgamma = 1/V - b/T), with the count identity. A queued job; this command waits.\n"
      "  circuitlab data-dependence r3\n  circuitlab data-dependence examples/induction.json --samples 16384");
  data_dep->add_option("TARGET", run_id, "Run id, or a spec file (associative recall with common pairs)")->required();
  data_dep->add_option("--samples", dd_samples, "Sequences per grid point (default 65536)");
  data_dep->add_flag("--force", p_force, "Recompute even if stored");

  std::string tv_sweep, tv_file, tv_hook, tv_subtract;
  std::vector<std::string> tv_analyses;
  std::vector<uint32_t> tv_layers;
  bool tv_all = false, tv_compat = false, tv_csv = false;
  uint32_t tv_samples = 0;
  auto* task_vectors = app.add_subcommand(
      "task-vectors",
      "Task-vector geometry (SCIENCE.md D.5) of a latent-task run: P0 residual ratio, P1 ANOVA, P2 simplex\n"
      "interpolation, P3 alignment with the Bayesian posterior, steering along the task simplex, OOD projection\n"
      "R^2, the two-Bayes mode transition and the double dissociation (task subspace vs the optimised orthogonal\n"
      "direction, with what that direction encodes). A queued job; this command waits. --all-checkpoints repeats it over\n"
      "training, --sweep over the newest checkpoint of every run of a sweep (e.g. OOD R^2 against diversity).\n"
      "  circuitlab task-vectors r3\n"
      "  circuitlab task-vectors r3 --analysis ood_r2 --all-checkpoints --csv > ood_over_training.csv\n"
      "  circuitlab task-vectors --sweep s2 --analysis ood_r2,kl --layer 1");
  task_vectors->add_option("RUN", run_id, "Run id (or give --sweep)");
  task_vectors->add_option("--sweep", tv_sweep, "Sweep id: analyse every run at its newest checkpoint");
  task_vectors->add_option("--analysis", tv_analyses,
                           "p0, p1, p2, p3, steering, ood_r2, kl, dissociation (default all)")
      ->delimiter(',');
  task_vectors->add_option("--step", d_step, "Checkpoint step (default: the newest)");
  task_vectors->add_flag("--all-checkpoints", tv_all, "Every stored checkpoint of the run");
  task_vectors->add_option("--layer", tv_layers, "Layer(s) from 0 (default all; repeatable or a,b)")->delimiter(',');
  task_vectors->add_option("--hook", tv_hook, "Hidden state: post_mlp (default), post_attn or resid_pre");
  task_vectors->add_option("--samples", tv_samples, "Token-conditioned sequences per cell (default 128)");
  task_vectors->add_flag("--paper-compat", tv_compat, "Steering: estimate at post_mlp, inject at post_attn");
  task_vectors->add_option("--steering-subtract", tv_subtract,
                           "Steering edit: true_task (E1 variant, default) or projection (E3 variant)");
  task_vectors->add_option("--spec", tv_file, "AnalyzeTaskVectorsRequest JSON file (every field; flags override)")
      ->check(CLI::ExistingFile);
  task_vectors->add_flag("--csv", tv_csv, "CSV: run_id,step,sweep_values,name,layer,position,value");
  task_vectors->add_flag("--force", p_force, "Recompute even if stored");

  auto* health = app.add_subcommand("health", "Check that the server is up and serving.\n  circuitlab health");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  ClientOptions opts;
  opts.server = g.server;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(g.timeout_s * 1000));
  if (!g.token_file.empty()) {
    std::ifstream in(g.token_file);
    std::getline(in, opts.token);
  }
  Client client(opts);
  c_names = SplitList(c_names);
  ss_values = SplitList(ss_values);
  iv_zero = SplitList(iv_zero);

  if (*submit) {
    auto spec = circuitlab::client::ReadSpecFile(spec_file);
    if (!spec.ok()) {
      std::cerr << "error: " << spec.status().message() << "\n";
      return 2;
    }
    auto run = client.SubmitRun(*spec);
    if (!run.ok()) return ReportError(run.status());
    if (g.json && !submit_watch) {
      std::cout << circuitlab::client::ToJson(*run) << "\n";
    } else {
      std::cerr << "submitted " << run->run_id() << " (" << run->name() << ", "
                << run->spec().training().steps() << " steps)\n";
      if (!submit_watch) std::cout << run->run_id() << "\n";
    }
    return submit_watch ? DoWatch(client, run->run_id(), g.json) : 0;
  }
  if (*ls) {
    v1::ListRunsRequest req;
    try {
      for (const auto& s : ls_states) req.add_states(ParseState(s));
    } catch (const CLI::ValidationError& e) {
      std::cerr << "error: " << e.what() << "\n";
      return 2;
    }
    for (const auto& t : ls_tags) req.add_tags(t);
    req.set_page_size(ls_limit);
    req.set_page_token(ls_page);
    auto resp = client.ListRuns(req);
    if (!resp.ok()) return ReportError(resp.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*resp) << "\n";
      return 0;
    }
    std::printf("%-7s %-10s %-8s %-16s %-24s %s\n", "RUN", "STATE", "DEVICE", "STEP", "CREATED", "NAME");
    for (const v1::Run& r : resp->runs()) {
      std::string step = std::to_string(r.progress().step()) + "/" + std::to_string(r.progress().total_steps());
      std::printf("%-7s %-10s %-8s %-16s %-24s %s\n", r.run_id().c_str(), StateName(r.state()).c_str(),
                  r.device().empty() ? "-" : r.device().c_str(), step.c_str(), FormatTime(r.created_at()).c_str(),
                  r.name().c_str());
    }
    std::cerr << resp->runs_size() << " of " << resp->total_size() << " run(s)";
    if (!resp->next_page_token().empty()) std::cerr << "; next page: --page-token " << resp->next_page_token();
    std::cerr << "\n";
    return 0;
  }
  if (*show) {
    auto run = client.GetRun(run_id);
    if (!run.ok()) return ReportError(run.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*run) << "\n";
    } else {
      PrintRunDetails(*run);
    }
    return 0;
  }
  if (*watch) return DoWatch(client, run_id, g.json);
  if (*cancel) {
    auto run = client.CancelRun(run_id);
    if (!run.ok()) return ReportError(run.status());
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    while (cancel_wait && !IsFinal(run->state()) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      run = client.GetRun(run_id);
      if (!run.ok()) return ReportError(run.status());
    }
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*run) << "\n";
    } else {
      std::cout << run->run_id() << " "
                << (IsFinal(run->state()) ? StateName(run->state()) : "cancel requested (stops at its next step)")
                << "\n";
    }
    return 0;
  }
  if (*metrics) {
    v1::GetMetricsRequest req;
    req.set_run_id(run_id);
    for (const auto& n : m_names) req.add_names(n);
    req.set_min_step(m_min);
    req.set_max_step(m_max);
    req.set_max_points(m_points);
    auto resp = client.GetMetrics(req);
    if (!resp.ok()) return ReportError(resp.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*resp) << "\n";
    } else if (m_csv) {
      std::cout << "run_id,name,step,value\n";
      for (const auto& s : resp->series()) {
        for (int i = 0; i < s.steps_size(); ++i) {
          std::printf("%s,%s,%llu,%.9g\n", run_id.c_str(), s.name().c_str(),
                      static_cast<unsigned long long>(s.steps(i)), s.values(i));
        }
      }
    } else {
      std::printf("%-32s %8s %10s %10s %10s %10s\n", "SERIES", "POINTS", "FIRST", "LAST", "MIN", "MAX");
      for (const auto& s : resp->series()) {
        if (s.values_size() == 0) continue;
        auto [mn, mx] = std::minmax_element(s.values().begin(), s.values().end());
        std::printf("%-32s %8llu %10.4f %10.4f %10.4f %10.4f\n", s.name().c_str(),
                    static_cast<unsigned long long>(s.total_points()), s.values(0), s.values(s.values_size() - 1),
                    *mn, *mx);
      }
    }
    return 0;
  }
  if (*coords) {
    v1::GetTrajectoryRequest req;
    req.set_run_id(run_id);
    req.set_selection(c_complete ? v1::BASIS_SELECTION_COMPLETE : v1::BASIS_SELECTION_PAPER);
    for (const auto& n : c_names) req.add_names(n);
    req.set_min_step(c_min);
    req.set_max_step(c_max);
    req.set_max_points(c_points);
    auto resp = client.GetTrajectory(req);
    if (!resp.ok()) return ReportError(resp.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*resp) << "\n";
      return 0;
    }
    if (c_csv) {
      std::cout << "run_id,label,canonical,step,value\n";
      for (const auto& s : resp->series()) {
        for (int i = 0; i < s.steps_size(); ++i) {
          std::printf("%s,\"%s\",%s,%llu,%.9g\n", run_id.c_str(), s.coordinate().label().c_str(),
                      s.coordinate().canonical().c_str(), static_cast<unsigned long long>(s.steps(i)), s.values(i));
        }
      }
      return 0;
    }
    if (resp->series_size() == 0) {
      std::cerr << "no coordinates recorded for " << run_id
                << (c_complete ? " (complete set: set recording.complete_coordinates)" : "") << "\n";
      return 0;
    }
    std::vector<const v1::CoordinateSeries*> rows;
    for (const auto& s : resp->series()) rows.push_back(&s);
    const size_t limit = c_all || !c_names.empty() ? rows.size() : std::min<size_t>(30, rows.size());
    if (limit < rows.size()) {
      std::stable_sort(rows.begin(), rows.end(), [](auto* a, auto* b) {
        return std::abs(a->coordinate().magnitude()) > std::abs(b->coordinate().magnitude());
      });
    }
    std::printf("%s %-6s %7s %10s %10s %10s\n", Pad("COORDINATE", 34).c_str(), "NAME", "POINTS", "FIRST", "LAST",
                "MAX|.|");
    for (size_t i = 0; i < limit; ++i) {
      const auto& s = *rows[i];
      double mx = 0;
      for (double v : s.values()) mx = std::max(mx, std::abs(v));
      std::printf("%s %-6s %7llu %10.4f %10.4f %10.4f\n", Pad(s.coordinate().label(), 34).c_str(),
                  s.coordinate().canonical().c_str(), static_cast<unsigned long long>(s.total_points()),
                  s.values_size() ? s.values(0) : 0.0, s.values_size() ? s.values(s.values_size() - 1) : 0.0, mx);
    }
    if (limit < rows.size()) std::cerr << limit << " of " << rows.size() << " coordinates (largest last magnitude; --all for every one)\n";
    v1::GetMetricsRequest mreq;
    mreq.set_run_id(run_id);
    mreq.add_names("manifold/rho");
    mreq.add_names("manifold/rho_paper");
    if (auto m = client.GetMetrics(mreq); m.ok()) {
      for (const auto& s : m->series()) {
        if (s.values_size() > 0) {
          std::printf("%s %-6s %7llu %10.4f %10.4f\n", Pad(s.name(), 34).c_str(), "",
                      static_cast<unsigned long long>(s.total_points()), s.values(0), s.values(s.values_size() - 1));
        }
      }
    }
    return 0;
  }
  if (*project) {
    v1::ProjectCheckpointRequest req;
    req.set_run_id(run_id);
    req.set_step(p_step);
    req.set_selection(c_complete ? v1::BASIS_SELECTION_COMPLETE : v1::BASIS_SELECTION_PAPER);
    req.set_force(p_force);
    auto resp = client.ProjectCheckpoint(req);
    if (!resp.ok()) return ReportError(resp.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*resp) << "\n";
      return 0;
    }
    std::printf("%s step %llu, %s basis (%d coordinates)%s\n", resp->run_id().c_str(),
                static_cast<unsigned long long>(resp->step()), c_complete ? "complete" : "paper",
                resp->coordinates_size(), resp->from_store() ? ", stored answer" : "");
    std::printf("rho %.4f (this basis), %.4f (complete)\n", resp->rho(), resp->rho_complete());
    for (const auto& [matrix, rho] : std::map<std::string, double>(resp->rho_by_matrix().begin(),
                                                                    resp->rho_by_matrix().end())) {
      std::printf("  rho %-6s %.4f\n", matrix.c_str(), rho);
    }
    std::vector<const v1::Coordinate*> rows;
    for (const auto& c : resp->coordinates()) rows.push_back(&c);
    std::stable_sort(rows.begin(), rows.end(),
                     [](auto* a, auto* b) { return std::abs(a->magnitude()) > std::abs(b->magnitude()); });
    const size_t limit = c_all ? rows.size() : std::min<size_t>(20, rows.size());
    std::printf("%s %-6s %12s %12s\n", Pad("COORDINATE", 34).c_str(), "NAME", "VALUE", "MAGNITUDE");
    for (size_t i = 0; i < limit; ++i) {
      std::printf("%s %-6s %12.5f %12.5f%s\n", Pad(rows[i]->label(), 34).c_str(), rows[i]->canonical().c_str(),
                  rows[i]->value(), rows[i]->magnitude(), rows[i]->gauge() ? "  (gauge)" : "");
    }
    return 0;
  }
  const bool tty = isatty(STDERR_FILENO);
  // A queued analysis: asks `call(force)` again (force only the first time)
  // until the job is DONE or FAILED, showing progress. Returns the exit code
  // when nothing is left to print (an RPC error, --json output, a failed
  // analysis); else nullopt with the DONE answer in *out. (CheckInvariance's
  // own state enum shares AnalysisState's numbers.)
  bool stored_answer = false;
  auto run_queued = [&](const std::string& what, auto call, auto* out) -> std::optional<int> {
    auto resp = call(p_force);
    stored_answer = resp.ok() && resp->from_store();
    auto state = [&] { return static_cast<int>(resp->state()); };
    bool first = true;
    while (resp.ok() && state() != v1::ANALYSIS_STATE_DONE && state() != v1::ANALYSIS_STATE_FAILED) {
      if (tty) {
        std::cerr << "\r" << (state() == v1::ANALYSIS_STATE_QUEUED ? "queued " : "running ")
                  << Fixed(100 * resp->progress(), 0) << "%\033[K" << std::flush;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(first ? 100 : 400));
      first = false;
      resp = call(false);
    }
    if (tty) std::cerr << "\r\033[K";
    if (!resp.ok()) return ReportError(resp.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*resp) << "\n";
      return state() == v1::ANALYSIS_STATE_DONE ? 0 : 1;
    }
    if (state() == v1::ANALYSIS_STATE_FAILED) {
      std::cerr << "error: " << what << " failed: " << resp->error() << "\n";
      return 1;
    }
    *out = std::move(*resp);
    return std::nullopt;
  };
  if (*invariance) {
    v1::CheckInvarianceRequest req;
    if (absl::Status st = SetTarget(run_id, &req); !st.ok()) return ReportError(st);
    req.set_selection(i_paper ? v1::BASIS_SELECTION_PAPER : v1::BASIS_SELECTION_COMPLETE);
    for (uint64_t n : i_samples) req.add_sample_sizes(n);
    req.set_coordinate_std(i_std);
    req.set_controls(i_controls);
    req.set_sgd_corollary(i_sgd);
    v1::CheckInvarianceResponse r;
    const auto* resp = &r;
    if (auto rc = run_queued("the invariance check", [&](bool force) {
          req.set_force(force);
          return client.CheckInvariance(req);
        }, &r)) {
      return *rc;
    }
    std::printf("ladder N:");
    for (uint64_t n : resp->sample_sizes()) std::printf(" %llu", static_cast<unsigned long long>(n));
    std::printf("%s\n", stored_answer ? "  (stored answer)" : "");
    for (const auto& check : resp->checks()) {
      std::printf("%s: %s (largest matrix plateau %.2e)\n", check.name().c_str(),
                  check.name() == "in_span" ? (check.passed() ? "IN SPAN" : "NOT IN SPAN")
                                            : (check.passed() ? "fails, as a control must" : "DID NOT FAIL"),
                  check.max_matrix_plateau());
      for (const auto& s : check.series()) {
        std::printf("  %-5s 1-f_N:", s.matrix().c_str());
        for (double v : s.off_fraction()) std::printf(" %.2e", v);
        std::printf("   plateau %.2e  slope %.3f\n", s.plateau(), s.slope());
      }
    }
    if (resp->sgd_size() > 0) {
      std::printf("SGD corollary (%llu steps, lr %g; symmetrised over %llu group elements):\n",
                  static_cast<unsigned long long>(resp->sgd_steps()), resp->sgd_learning_rate(),
                  static_cast<unsigned long long>(resp->sgd_group_elements()));
      for (const auto& p : resp->sgd()) {
        std::printf("  batch %5llu  rho %.3e  symmetrised %.3e\n", static_cast<unsigned long long>(p.batch_size()),
                    p.rho(), p.rho_symmetrised());
      }
    }
    return 0;
  }
  if (*sweep) {
    v1::SweepSpec spec;
    if (absl::Status st = circuitlab::client::ReadJsonFile(sweep_file, &spec); !st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 2;
    }
    auto sw = client.SubmitSweep(spec);
    if (!sw.ok()) return ReportError(sw.status());
    std::cerr << "submitted " << sw->sweep_id() << " (" << sw->name() << ", " << sw->run_ids_size() << " runs: "
              << (sw->run_ids_size() ? sw->run_ids(0) + ".." + sw->run_ids(sw->run_ids_size() - 1) : "") << ")\n";
    if (!sw_watch) {
      std::cout << (g.json ? circuitlab::client::ToJson(*sw) : sw->sweep_id()) << "\n";
      return 0;
    }
    while (!sw->done() && !g_interrupted.load()) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      sw = client.GetSweep(sw->sweep_id());
      if (!sw.ok()) return ReportError(sw.status());
      std::string states;
      for (const auto& [name, n] : std::map<std::string, uint32_t>(sw->states().begin(), sw->states().end())) {
        states += " " + StateName(static_cast<v1::RunState>(v1::RunState_descriptor()->FindValueByName(name)->number())) +
                  " " + std::to_string(n);
      }
      std::cerr << (tty ? "\r" : "") << sw->sweep_id() << ":" << states << (tty ? "\033[K" : "\n") << std::flush;
    }
    if (tty) std::cerr << "\n";
    if (g_interrupted.load()) return 130;
    v1::GetSweepSummaryRequest req;
    req.set_sweep_id(sw->sweep_id());
    auto summary = client.GetSweepSummary(req);
    if (!summary.ok()) return ReportError(summary.status());
    std::cout << (g.json ? circuitlab::client::ToJson(*summary) + "\n" : circuitlab::client::SummaryTable(*summary));
    return 0;
  }
  if (*sweep_show || *sweep_cancel) {
    auto sw = *sweep_show ? client.GetSweep(sweep_id) : client.CancelSweep(sweep_id);
    if (!sw.ok()) return ReportError(sw.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*sw) << "\n";
      return 0;
    }
    std::cout << sw->sweep_id() << "  " << sw->name() << "  " << sw->run_ids_size() << " runs"
              << (sw->done() ? "  (done)" : "") << "\n";
    for (const auto& [name, n] : std::map<std::string, uint32_t>(sw->states().begin(), sw->states().end())) {
      std::cout << "  " << name.substr(std::string("RUN_STATE_").size()) << " " << n << "\n";
    }
    return 0;
  }
  if (*sweep_summary) {
    v1::GetSweepSummaryRequest req;
    req.set_sweep_id(sweep_id);
    for (const auto& v : ss_values) req.add_values(v);
    for (const auto& f : ss_filters) req.add_filters(f);
    if (!ss_pivot.empty()) {
      req.mutable_pivot()->set_x(ss_pivot[0]);
      req.mutable_pivot()->set_y(ss_pivot[1]);
      req.mutable_pivot()->set_value(!ss_value.empty() ? ss_value : ss_values.empty() ? "" : ss_values[0]);
      req.mutable_pivot()->set_aggregate(ss_agg);
    } else if (!ss_svg.empty()) {
      std::cerr << "error: --svg needs --pivot X Y\n";
      return 2;
    }
    auto resp = client.GetSweepSummary(req);
    while (ss_wait && resp.ok() && resp->pending() > 0 && !g_interrupted.load()) {
      if (tty) std::cerr << "\r" << resp->pending() << " cell(s) being computed\033[K" << std::flush;
      std::this_thread::sleep_for(std::chrono::seconds(1));
      resp = client.GetSweepSummary(req);
    }
    if (tty && ss_wait) std::cerr << "\r\033[K";
    if (!resp.ok()) return ReportError(resp.status());
    if (!ss_svg.empty()) {
      std::ofstream out(ss_svg);
      out << circuitlab::client::PivotSvg(resp->pivot(), resp->sweep_id() + ": " + resp->pivot().value());
      if (!out) {
        std::cerr << "error: cannot write " << ss_svg << "\n";
        return 2;
      }
      std::cerr << "wrote " << ss_svg << "\n";
    }
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*resp) << "\n";
    } else if (ss_csv) {
      std::cout << circuitlab::client::SummaryCsv(*resp);
    } else if (req.has_pivot()) {
      std::cout << circuitlab::client::PivotText(resp->pivot(), isatty(STDOUT_FILENO));
    } else {
      std::cout << circuitlab::client::SummaryTable(*resp);
    }
    if (resp->pending() > 0) std::cerr << resp->pending() << " cell(s) still being computed (ask again, or --wait)\n";
    return 0;
  }
  if (*detect) {
    v1::DetectCircuitRequest req;
    req.set_run_id(run_id);
    req.set_step(d_step);
    req.set_eval_set(d_set);
    req.set_metric(d_metric);
    req.set_tolerance(d_tol);
    req.set_order(d_order);
    req.set_n_eval(d_n);
    req.set_max_evals(d_evals);
    req.set_selection(c_complete ? v1::BASIS_SELECTION_COMPLETE : v1::BASIS_SELECTION_PAPER);
    v1::DetectCircuitResponse r;
    const auto* resp = &r;
    if (auto rc = run_queued("circuit detection", [&](bool force) {
          req.set_force(force);
          return client.DetectCircuit(req);
        }, &r)) {
      return *rc;
    }
    std::printf("%s step %llu, %s on %s%s\n", run_id.c_str(), static_cast<unsigned long long>(resp->step()),
                resp->metric().c_str(), resp->eval_set().c_str(), stored_answer ? "  (stored answer)" : "");
    std::printf("dense %.4f   all coordinates %.4f   circuit %.4f   (%u of %u coordinates kept, %u evaluations%s)\n",
                resp->m_dense(), resp->m_ref(), resp->m_circuit(), resp->circuit_size(), resp->candidates(),
                resp->evaluations(), resp->budget_exhausted() ? ", budget exhausted" : "");
    if (resp->projection_not_faithful()) {
      std::printf("note: the projection is not faithful (|dense - all coordinates| > 0.05): the circuit describes "
                  "the projected model\n");
    }
    std::string layers;
    for (uint32_t l : resp->template_layers()) layers += (layers.empty() ? "" : ",") + std::to_string(l);
    std::printf("template: %s%s\n", resp->template_name().empty() ? "none recognised" : resp->template_name().c_str(),
                layers.empty() ? "" : (" (layers " + layers + ")").c_str());
    for (const auto& e : resp->template_elements()) {
      std::printf("  %s %s %s\n", e.found() ? "[x]" : "[ ]", Pad(e.label(), 30).c_str(), e.canonical().c_str());
    }
    std::printf("%s %-6s %-9s %10s %10s %10s\n", Pad("COORDINATE", 30).c_str(), "NAME", "ROLE", "VALUE", "MAGNITUDE",
                "NECESSITY");
    for (const auto& c : resp->circuit()) {
      std::printf("%s %-6s %-9s %10.4f %10.4f %10.4f", Pad(c.coordinate().label(), 30).c_str(),
                  c.coordinate().canonical().c_str(), c.role().c_str(), c.coordinate().value(),
                  c.coordinate().magnitude(), c.necessity());
      if (c.irrelevant_mass_delta_size() > 0) {
        std::printf("  irrelevant-key mass without it:");
        for (double v : c.irrelevant_mass_delta()) std::printf(" %+.3f", v);
      }
      std::printf("\n");
    }
    if (resp->irrelevant_mass_size() > 0) {
      std::printf("irrelevant-key attention mass per layer with the circuit:");
      for (double v : resp->irrelevant_mass()) std::printf(" %.3f", v);
      std::printf("\n");
    }
    return 0;
  }
  if (*intervene) {
    v1::InterveneRequest req;
    if (!iv_file.empty()) {
      if (absl::Status st = circuitlab::client::ReadJsonFile(iv_file, &req); !st.ok()) {
        std::cerr << "error: " << st.message() << "\n";
        return 2;
      }
    }
    req.set_run_id(run_id);
    if (d_step) req.set_step(d_step);
    if (d_n) req.set_n_eval(d_n);
    for (const auto& s : iv_sets) req.add_eval_sets(s);
    if (!iv_zero.empty()) {
      v1::Intervention* op = req.add_interventions();
      op->set_op(v1::Intervention::OP_ZERO_COORDINATE);
      for (const auto& c : iv_zero) op->add_coordinates(c);
    }
    for (uint32_t layer : iv_heads) {
      v1::Intervention* op = req.add_interventions();
      op->set_op(v1::Intervention::OP_ABLATE_HEAD);
      op->set_layer(layer);
    }
    if (req.interventions_size() == 0) {
      std::cerr << "error: no intervention given: use --spec FILE, --zero or --ablate-head\n";
      return 2;
    }
    req.set_force(p_force);
    auto resp = client.Intervene(req);
    if (!resp.ok()) return ReportError(resp.status());
    if (g.json) {
      std::cout << circuitlab::client::ToJson(*resp) << "\n";
      return 0;
    }
    std::printf("%s step %llu%s\n", resp->run_id().c_str(), static_cast<unsigned long long>(resp->step()),
                resp->from_store() ? "  (stored answer)" : "");
    for (int i = 0; i < resp->edited_size(); ++i) {
      std::printf("  edited %s: %.4f -> %.4f\n", resp->edited(i).label().c_str(), resp->edited_before(i),
                  resp->edited(i).value());
    }
    std::printf("%-12s %9s %9s %9s %9s %9s %18s\n", "SET", "ACC", "ACC'", "LOSS", "LOSS'", "KL", "LOGIT DIFF -> '");
    for (const auto& e : resp->effects()) {
      std::printf("%-12s %9.4f %9.4f %9.4f %9.4f %9.4f", e.eval_set().c_str(), e.accuracy_clean(), e.accuracy(),
                  e.loss_clean(), e.loss(), e.kl_clean());
      if (e.has_logit_diff()) std::printf(" %8.3f -> %7.3f", e.logit_diff_clean(), e.logit_diff());
      if (e.has_kl_ref()) std::printf("  KL(.||%s) %.4f -> %.4f", e.ref_name().c_str(), e.kl_ref_clean(), e.kl_ref());
      std::printf("\n");
      for (const auto& m : e.attention_mass()) {
        std::printf("%-12s attention mass at %s per head:", "", m.pattern().c_str());
        for (int h = 0; h < m.clean_size() && h < m.intervened_size(); ++h) {
          std::printf("  h%d %.4f -> %.4f", h + 1, m.clean(h), m.intervened(h));
        }
        std::printf("\n");
      }
    }
    return 0;
  }
  if (*label) {
    v1::LabelRunRequest req;
    req.set_run_id(run_id);
    v1::LabelRunResponse r;
    const auto* resp = &r;
    if (auto rc = run_queued("labelling", [&](bool force) {
          req.set_force(force);
          return client.LabelRun(req);
        }, &r)) {
      return *rc;
    }
    std::printf("%s: %s%s%s\n", run_id.c_str(), resp->label().c_str(),
                resp->pair().empty() ? "" : ("  pair " + resp->pair()).c_str(),
                resp->pair_predicted().empty() ? "" : ("  (initial magnitudes predicted " + resp->pair_predicted() + ")").c_str());
    std::printf("%8s %-12s %8s %8s %-4s %-4s %-6s %-6s %8s %-14s %s\n", "STEP", "ICL SET", "ICL ACC", "IWL ACC", "ICL",
                "IWL", "C_ICL", "C_IWL", "LD", "LABEL", "PAIR");
    for (const auto& c : resp->checkpoints()) {
      std::printf("%8llu %-12s %8.4f %8.4f %-4s %-4s %-6s %-6s %8.3f %-14s %s\n",
                  static_cast<unsigned long long>(c.step()), c.icl_set().c_str(), c.icl_accuracy(), c.iwl_accuracy(),
                  c.icl() ? "yes" : "no", c.iwl() ? "yes" : "no", c.coords_icl() ? "yes" : "no",
                  c.coords_iwl() ? "yes" : "no", c.conflict_logit_diff(), c.label().c_str(), c.pair().c_str());
    }
    if (resp->checkpoints_size() > 0 && resp->checkpoints().rbegin()->head_ablation_size() > 0) {
      // How the last checkpoint's pair was found: heads and pair paths zeroed.
      const v1::CheckpointLabel& last = *resp->checkpoints().rbegin();
      std::printf("step %llu, share of accuracy above chance removed by zeroing\n  heads:",
                  static_cast<unsigned long long>(last.step()));
      for (int l = 0; l < last.head_ablation_size(); ++l) std::printf("  L%d %.2f", l + 1, last.head_ablation(l));
      std::map<std::string, double> paths(last.pair_ablation().begin(), last.pair_ablation().end());
      std::printf("\n  pair paths (match coordinates):");
      for (const auto& [name, s] : paths) std::printf("  %s %.2f", name.c_str(), s);
      std::map<std::string, double> scores(last.pair_scores().begin(), last.pair_scores().end());
      std::printf("\n  pair scores |prev| |match| |out|:");
      for (const auto& [name, s] : scores) std::printf("  %s %.3g", name.c_str(), s);
      std::printf("\n");
    }
    return 0;
  }
  if (*data_dep) {
    v1::CheckDataDependenceRequest req;
    if (absl::Status st = SetTarget(run_id, &req); !st.ok()) return ReportError(st);
    req.set_samples(dd_samples);
    v1::CheckDataDependenceResponse r;
    const auto* resp = &r;
    if (auto rc = run_queued("the data-dependence check", [&](bool force) {
          req.set_force(force);
          return client.CheckDataDependence(req);
        }, &r)) {
      return *rc;
    }
    std::printf("%llu sequences per point%s\n", static_cast<unsigned long long>(resp->samples()),
                stored_answer ? "  (stored answer)" : "");
    std::printf("%-8s %5s %5s %3s %7s %5s %11s %9s %11s %8s %8s %6s %9s\n", "MODE", "F_R", "F_V", "B", "DELTA", "ABG",
                "DL/DGAMMA", "STDERR", "CLOSED", "RATIO", "VECTOR", "PHI", "IDENTITY");
    for (const auto& r : resp->rows()) {
      const auto& p = r.point();
      std::printf("%-8s %5.2f %5.2f %3u %7.3f %5.2f %11.4e %9.2e %11.4e %8.4f %8.4f %6.3f %9.1e\n",
                  p.variability_mode() == v1::VARIABILITY_MODE_REPAIR ? "repair" : "variant", p.rare_fraction(),
                  p.variability(), p.burstiness(), p.delta(), p.abg(), r.grad_gamma(), r.gamma_stderr(),
                  r.closed_form_gamma(), r.ratio(), r.ratio_vector(), r.phi(), r.identity_max_rel_error());
    }
    return 0;
  }
  if (*task_vectors) {
    v1::AnalyzeTaskVectorsRequest req;
    if (!tv_file.empty()) {
      if (absl::Status st = circuitlab::client::ReadJsonFile(tv_file, &req); !st.ok()) {
        std::cerr << "error: " << st.message() << "\n";
        return 2;
      }
    }
    if (!run_id.empty()) req.set_run_id(run_id);
    if (!tv_sweep.empty()) req.set_sweep_id(tv_sweep);
    if (req.run_id().empty() == req.sweep_id().empty()) {
      std::cerr << "error: give a RUN or --sweep SWEEP (one of them)\n";
      return 2;
    }
    if (d_step) req.set_step(d_step);
    if (tv_all) req.set_all_checkpoints(true);
    if (!tv_analyses.empty()) {
      req.clear_analyses();
      for (const auto& a : tv_analyses) req.add_analyses(a);
    }
    if (!tv_layers.empty()) {
      req.clear_layers();
      for (uint32_t l : tv_layers) req.add_layers(l);
    }
    if (!tv_hook.empty()) req.set_hook(tv_hook);
    if (tv_samples) req.set_samples_per_cell(tv_samples);
    if (tv_compat) req.set_paper_compat(true);
    if (!tv_subtract.empty()) req.set_steering_subtract(tv_subtract);
    v1::AnalyzeTaskVectorsResponse r;
    if (auto rc = run_queued("the task-vector analysis", [&](bool force) {
          req.set_force(force);
          return client.AnalyzeTaskVectors(req);
        }, &r)) {
      return *rc;
    }
    if (tv_csv) {
      std::cout << circuitlab::client::TaskVectorCsv(r);
    } else {
      std::cout << circuitlab::client::TaskVectorText(r);
      if (stored_answer) std::cout << "(stored answer)\n";
    }
    return 0;
  }
  if (*health) {
    absl::Status s = client.Health();
    if (!s.ok()) return ReportError(s);
    std::cout << "SERVING " << g.server << "\n";
    return 0;
  }
  return 2;
}
