#include "server/http/dashboard_assets.h"

namespace circuitlab::http {
namespace {

std::string_view ContentType(std::string_view name) {
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  if (ends(".txt") || ends("LICENSE")) return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace

std::optional<DashboardAsset> FindDashboardAsset(std::string_view path) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  for (const EmbeddedFile& f : DashboardFiles()) {
    if (path.substr(1) == f.name) return DashboardAsset{f.bytes, ContentType(f.name)};
  }
  return std::nullopt;
}

}  // namespace circuitlab::http
