// The dashboard's static files (dashboard/ in the source tree), compiled into
// the server by cmake/embed_assets.cmake so that the binary serves them with
// nothing installed beside it.
#pragma once

#include <cstddef>
#include <string_view>

namespace circuitlab::http {

struct DashboardAsset {
  const char* path;  // "/index.html", "/vendor/uplot/uPlot.iife.min.js"
  const char* content_type;
  const unsigned char* data;
  size_t size;
};

// nullptr when there is no such file.
const DashboardAsset* FindDashboardAsset(std::string_view path);

}  // namespace circuitlab::http
