// The dashboard's static files (dashboard/ in the source tree), compiled into
// the server by cmake/embed_files.cmake so that the binary serves them with
// nothing installed beside it.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "server/common/embedded_file.h"

namespace circuitlab::http {

// Every file, by its path under dashboard/ ("index.html",
// "vendor/uplot/uPlot.iife.min.js"); generated (dashboard_files.cc).
std::span<const EmbeddedFile> DashboardFiles();

struct DashboardAsset {
  std::string_view bytes;
  std::string_view content_type;  // by the file's extension
};

// The file served at `path` ("/index.html"); nullopt when there is none.
std::optional<DashboardAsset> FindDashboardAsset(std::string_view path);

}  // namespace circuitlab::http
