// Small text renderings the command-line client and other front ends share:
// numbers, durations, times, run states, padding to terminal columns, and
// escaping text another client chose.
#pragma once

#include <google/protobuf/timestamp.pb.h>

#include <string>

#include "circuitlab/v1/experiment_service.pb.h"

namespace circuitlab::client {

// "%.<digits>f".
std::string Fixed(double v, int digits = 3);
// "1h02m", "3m07s"; "-" for a non-positive or non-finite value.
std::string Duration(double seconds);
// Local "YYYY-MM-DD HH:MM:SS"; "-" for an unset timestamp.
std::string FormatTime(const google::protobuf::Timestamp& t);
// "SUCCEEDED" for RUN_STATE_SUCCEEDED.
std::string StateName(v1::RunState s);
bool IsFinal(v1::RunState s);
// A CSV field: quoted (quotes doubled) when it holds a comma, a quote or a
// newline, else as it is.
std::string CsvField(const std::string& s);
// Left-aligns to `width` terminal columns (labels hold multi-byte "∅→").
std::string Pad(const std::string& s, size_t width);
// Control characters as \xNN (C0, DEL) or \uNNNN (C1 controls, bidirectional
// formatting: server/common/text.h's ControlAt), so text another client chose
// cannot move the cursor, forge lines or reorder what a terminal shows.
std::string EscapeForTerminal(const std::string& text);

}  // namespace circuitlab::client
