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

// The length in bytes of the control character that starts at text[i], or
// 0: C0 controls and DEL (1 byte); in UTF-8, the C1 controls U+0080..U+009F
// (2 bytes: a terminal reads U+009B as CSI) and the characters that reorder
// text on screen, U+061C, U+200E, U+200F, U+202A..U+202E and U+2066..U+2069
// (a right-to-left override makes "gpj.exe" look like "exe.jpg").
inline size_t ControlAt(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u; };
  const unsigned c = b(0);
  if (c < 0x20 || c == 0x7F) return 1;
  if (c == 0xC2 && b(1) >= 0x80 && b(1) <= 0x9F) return 2;
  if (c == 0xD8 && b(1) == 0x9C) return 2;
  if (c == 0xE2 && b(1) == 0x80 && (b(2) == 0x8E || b(2) == 0x8F || (b(2) >= 0xAA && b(2) <= 0xAE))) return 3;
  if (c == 0xE2 && b(1) == 0x81 && b(2) >= 0xA6 && b(2) <= 0xA9) return 3;
  return 0;
}

// The code point of the control ControlAt found (1 to 3 bytes of UTF-8).
inline unsigned ControlCodePoint(std::string_view text, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(text[i + k])); };
  if (n == 1) return b(0);
  if (n == 2) return ((b(0) & 0x1Fu) << 6) | (b(1) & 0x3Fu);
  return ((b(0) & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
}

// `text` with control characters (ControlAt) written as \n, \t, \xHH or
// \uHHHH, so a client string cannot forge lines in the log or drive or
// reorder a terminal.
inline std::string EscapeControl(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = ControlAt(text, i);
    if (n == 0) {
      out += text[i++];
      continue;
    }
    const unsigned cp = ControlCodePoint(text, i, n);
    if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, cp < 0x80 ? "\\x%02x" : "\\u%04x", cp);
      out += buf;
    }
    i += n;
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

// Whether `text` holds a control character (ControlAt: C0, DEL, C1, or a
// bidirectional formatting character).
inline bool HasControl(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (ControlAt(text, i) != 0) return true;
  }
  return false;
}

}  // namespace circuitlab
