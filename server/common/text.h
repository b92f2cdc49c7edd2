// Client strings the server repeats: clipped in error messages, escaped in
// the log. Header-only.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace circuitlab {

// `text` when it has at most `max` bytes, else its first `max` bytes (cut at
// a UTF-8 character boundary) followed by "…". Error messages quote client
// strings through it, so a huge name cannot make a huge answer.
inline std::string Clip(std::string_view text, size_t max = 200) {
  if (text.size() <= max) return std::string(text);
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;  // continuation byte
  return std::string(text.substr(0, end)) + "…";
}

// `text` with control characters (C0, DEL) written as \n, \t or \xHH, so
// a client string cannot forge lines in the log or drive a terminal.
inline std::string EscapeControl(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// A client string quoted for an error message: clipped, control characters
// escaped, in single quotes.
// (Appended, not `"'" + s + "'"`: GCC 12 at -O3 reports a false -Wrestrict
// inside std::string's operator+ at every caller; GCC bug 105329.)
inline std::string Quote(std::string_view text) {
  std::string out = "'";
  out += EscapeControl(Clip(text));
  out += '\'';
  return out;
}

// Whether `text` holds a control character (C0 or DEL).
inline bool HasControl(std::string_view text) {
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) return true;
  }
  return false;
}

}  // namespace circuitlab
