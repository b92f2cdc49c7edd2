// circuitlab export RUN [--step S] --out FILE.safetensors: the weights of a
// stored checkpoint as a safetensors file, and the model's configuration
// beside it (FILE.json), for Python (circuitlab.load_model) or any tool that
// reads safetensors. docs/reference/weights.md names the tensors.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <google/protobuf/struct.pb.h>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace export_cmd {

struct Options {
  std::string run_id, out;
  uint64_t step = 0;
  bool force = false;
};

// Writes `bytes` to `path` through a temporary beside it (no half file).
bool WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  const std::filesystem::path tmp = path.string() + ".part";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f || !f.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) || !f.flush()) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

int Run(Context& ctx, const Options& o) {
  v1::ExportWeightsRequest req;
  req.set_run_id(o.run_id);
  req.set_step(o.step);
  v1::ExportWeightsResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::ExportWeightsResponse>(req);
  };
  // The answer holds the file: never printed as JSON.
  Globals quiet = ctx.g;
  quiet.json = false;
  Context plain{ctx.client, quiet, ctx.timeout};
  if (auto rc = RunAnalysis(plain, "export", o.force, call, &resp)) return *rc;
  std::filesystem::path file(o.out);
  std::filesystem::path config = file;
  config.replace_extension(".json");
  if (config == file) config += ".json";
  if (!WriteFile(file, resp.safetensors()) || !WriteFile(config, resp.config_json() + "\n")) {
    std::fprintf(stderr, "error: cannot write %s or %s\n", file.c_str(), config.c_str());
    return 2;
  }
  if (ctx.g.json) {
    google::protobuf::Struct done;
    auto& f = *done.mutable_fields();
    f["run_id"].set_string_value(resp.run_id());
    f["step"].set_number_value(static_cast<double>(resp.step()));
    f["family"].set_string_value(resp.family());
    f["parameters"].set_number_value(static_cast<double>(resp.parameters()));
    f["file"].set_string_value(file.string());
    f["config"].set_string_value(config.string());
    std::cout << client::ToJson(done) << "\n";
    return 0;
  }
  std::printf("%s step %llu (%s model): %llu weights -> %s (%.1f KiB), configuration -> %s\n", resp.run_id().c_str(),
              static_cast<unsigned long long>(resp.step()), resp.family().c_str(),
              static_cast<unsigned long long>(resp.parameters()), file.c_str(),
              static_cast<double>(resp.safetensors().size()) / 1024.0, config.c_str());
  return 0;
}

}  // namespace export_cmd
}  // namespace

void AddExport(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<export_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "export",
                          "The weights of a stored checkpoint as a safetensors file (float32, the engine's tensor\n"
                          "names; docs/reference/weights.md) and the model's configuration as JSON beside it\n"
                          "(the same name, .json). Python: circuitlab.load_model(FILE) or Client.load_model(run).\n"
                          "  circuitlab export r1 --out r1.safetensors\n"
                          "  circuitlab export r1 --step 300 --out r1-300.safetensors",
                          o, export_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_option("--out", o->out, "The safetensors file to write (its configuration goes beside it, .json)")
      ->required();
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
