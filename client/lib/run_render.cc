#include "client/lib/run_render.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "client/lib/client.h"
#include "client/lib/text_format.h"

namespace circuitlab::client {

std::string RunDetailsText(const v1::Run& run) {
  const v1::Progress& p = run.progress();
  std::ostringstream out;
  out << "run        " << run.run_id() << "  " << EscapeForTerminal(run.name()) << "\n"
      << "state      " << StateName(run.state()) << (run.device().empty() ? "" : "  on " + run.device())
      << "  attempts " << run.attempts() << "\n"
      << "progress   step " << p.step() << "/" << p.total_steps();
  if (p.steps_per_second() > 0) out << "  " << Fixed(p.steps_per_second(), 1) << " steps/s";
  out << "  checkpoint at step " << run.checkpoint_step() << "\n"
      << "created    " << FormatTime(run.created_at()) << "  started " << FormatTime(run.started_at())
      << "  finished " << FormatTime(run.finished_at()) << "\n";
  if (run.tags_size() > 0) {
    out << "tags      ";
    for (const auto& t : run.tags()) out << " " << EscapeForTerminal(t);
    out << "\n";
  }
  if (!run.error().empty()) out << "error      " << EscapeForTerminal(run.error()) << "\n";
  if (!run.warning().empty()) out << "warning    " << EscapeForTerminal(run.warning()) << "\n";
  if (!run.owner().empty()) out << "owner      " << EscapeForTerminal(run.owner()) << "\n";
  if (run.packed_with_size() > 0) {
    out << "packed with";
    for (const auto& other : run.packed_with()) out << " " << EscapeForTerminal(other);
    out << "  (one ensemble job on " << run.device() << ")\n";
  }
  if (!p.latest().empty()) {
    out << "latest metrics:\n";
    for (const auto& [name, value] : std::map<std::string, double>(p.latest().begin(), p.latest().end())) {
      char line[128];
      std::snprintf(line, sizeof line, "  %-32s %.4f\n", name.c_str(), value);
      out << line;
    }
  }
  return out.str();
}

ProgressPrinter::ProgressPrinter(bool json) : json_(json), tty_(isatty(STDERR_FILENO)) {}

void ProgressPrinter::OnEvent(const v1::RunEvent& ev) {
  if (json_) {
    std::cout << ToJson(ev, false) << "\n" << std::flush;
    return;
  }
  if (ev.has_snapshot()) {
    const v1::Run& run = ev.snapshot();
    total_ = run.progress().total_steps();
    run_id_ = run.run_id();
    if (!announced_) {
      std::cerr << "watching " << run.run_id() << " (" << EscapeForTerminal(run.name())
                << "): " << StateName(run.state()) << "\n";
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

void ProgressPrinter::EndLine() {
  if (drawn_ && tty_) std::cerr << "\n";
  drawn_ = false;
}

std::string ProgressPrinter::Get(const std::string& key) const {
  auto it = latest_.find(key);
  return it == latest_.end() ? "-" : Fixed(it->second);
}

void ProgressPrinter::Draw(uint64_t step, double rate, double eta) {
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

}  // namespace circuitlab::client
