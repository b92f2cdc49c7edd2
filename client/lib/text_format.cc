#include "client/lib/text_format.h"

#include <cmath>
#include <cstdio>
#include <ctime>

#include "server/common/text.h"

namespace circuitlab::client {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
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

std::string FormatTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  std::time_t secs = t.seconds();
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::localtime(&secs));
  return buf;
}

std::string StateName(v1::RunState s) {
  std::string name = v1::RunState_Name(s);
  const std::string prefix = "RUN_STATE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return name;
}

bool IsFinal(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED;
}

std::string Pad(const std::string& s, size_t width) {
  size_t columns = 0;
  for (unsigned char c : s) columns += (c & 0xC0) != 0x80;
  return columns >= width ? s : s + std::string(width - columns, ' ');
}

std::string EscapeForTerminal(const std::string& text) { return EscapeControl(text); }

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace circuitlab::client
