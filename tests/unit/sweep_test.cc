// Sweep expansion (grid, random, JSON pointers, "also"), its errors, and the
// summary renderings.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "client/lib/sweep_render.h"
#include "server/scheduler/sweeps.h"

namespace circuitlab::scheduler {
namespace {

v1::SweepSpec Parse(const std::string& json) {
  v1::SweepSpec s;
  const auto st = google::protobuf::util::JsonStringToMessage(json, &s);
  EXPECT_TRUE(st.ok()) << st.message();
  return s;
}

TEST(ExpandSweepTest, GridIsTheProductInOrderWithNamesAndTags) {
  const auto sweep = Parse(R"({
    "name": "lr-seed", "tags": ["sw"],
    "base": {"name": "base", "seed": 5, "tags": ["t"], "training": {"learning_rate": 1.0, "steps": 10}},
    "axes": [{"field": "training.learning_rate", "name": "lr", "values": [0.5, 2]},
             {"field": "seed", "values": [1, 2, 3]}]})");
  auto members = ExpandSweep(sweep, 100);
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 6u);
  EXPECT_EQ(AxisNames(sweep), (std::vector<std::string>{"lr", "seed"}));
  // The last axis varies fastest.
  EXPECT_DOUBLE_EQ((*members)[0].spec.training().learning_rate(), 0.5);
  EXPECT_EQ((*members)[0].spec.seed(), 1u);
  EXPECT_EQ((*members)[2].spec.seed(), 3u);
  EXPECT_DOUBLE_EQ((*members)[3].spec.training().learning_rate(), 2.0);
  EXPECT_EQ((*members)[3].spec.seed(), 1u);
  EXPECT_EQ((*members)[4].spec.name(), "base[lr=2,seed=2]");
  // Fields the axes do not touch keep the base's values.
  EXPECT_EQ((*members)[5].spec.training().steps(), 10u);
  ASSERT_EQ((*members)[5].spec.tags_size(), 2);
  EXPECT_EQ((*members)[5].spec.tags(1), "sw");
  EXPECT_DOUBLE_EQ((*members)[5].values[0].number_value(), 2.0);
}

TEST(ExpandSweepTest, JsonPointerAndAlsoSetMapKeysThatHoldDots) {
  const auto sweep = Parse(R"({
    "base": {"model": {"imir": {"initial_coordinates": {"x": 0.1}}}},
    "axes": [{"field": "/model/imir/initial_coordinates/L1H1:[∅→∅]:S_1", "name": "a", "values": [1.5],
              "also": ["/model/imir/initial_coordinates/a.b"]}]})");
  auto members = ExpandSweep(sweep, 10);
  ASSERT_TRUE(members.ok()) << members.status();
  const auto& init = (*members)[0].spec.model().imir().initial_coordinates();
  EXPECT_DOUBLE_EQ(init.at("L1H1:[∅→∅]:S_1"), 1.5);
  EXPECT_DOUBLE_EQ(init.at("a.b"), 1.5);
  EXPECT_DOUBLE_EQ(init.at("x"), 0.1);
}

TEST(ExpandSweepTest, RandomAxesAreSeededAndInRange) {
  const auto sweep = Parse(R"({"samples": 20, "seed": 3,
    "base": {},
    "axes": [{"field": "training.learning_rate", "name": "lr", "range": {"min": 0.01, "max": 10, "log": true}},
             {"field": "training.batch_size", "name": "bs", "range": {"min": 8, "max": 64, "integer": true}},
             {"field": "seed", "values": [1, 2]}]})");
  auto a = ExpandSweep(sweep, 100), b = ExpandSweep(sweep, 100);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 40u);
  std::set<double> distinct;
  for (size_t i = 0; i < a->size(); ++i) {
    const double lr = (*a)[i].spec.training().learning_rate();
    EXPECT_GE(lr, 0.01);
    EXPECT_LE(lr, 10);
    EXPECT_EQ(lr, (*b)[i].spec.training().learning_rate());  // same seed, same draws
    const uint32_t bs = (*a)[i].spec.training().batch_size();
    EXPECT_GE(bs, 8u);
    EXPECT_LE(bs, 64u);
    distinct.insert(lr);
  }
  EXPECT_EQ(distinct.size(), 20u);  // one draw per sample, shared by the grid cells
}

TEST(ExpandSweepTest, ErrorsNameTheAxisAndField) {
  auto expect = [](const std::string& json, absl::StatusCode code, const std::string& needle) {
    auto r = ExpandSweep(Parse(json), 8);
    ASSERT_FALSE(r.ok()) << json;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  expect(R"({"axes": [{"field": "seed"}]})", absl::StatusCode::kInvalidArgument, "sweep.axes[0] must have either");
  expect(R"({"axes": [{"field": "", "values": [1]}]})", absl::StatusCode::kInvalidArgument, "sweep.axes[0].field");
  expect(R"({"axes": [{"field": "training.no_such_field", "values": [1]}]})", absl::StatusCode::kInvalidArgument,
         "no_such_field");
  expect(R"({"axes": [{"field": "training.steps", "values": ["many"]}]})", absl::StatusCode::kInvalidArgument,
         "sweep member [steps=many]");
  expect(R"({"axes": [{"field": "seed", "values": [1,2,3]}, {"field": "training.steps", "values": [1,2,3]}]})",
         absl::StatusCode::kResourceExhausted, "--max-sweep-runs=8");
  expect(R"({"axes": [{"field": "seed", "values": [1]}, {"field": "a.seed", "values": [2]}]})",
         absl::StatusCode::kInvalidArgument, "used by another axis");
  expect(R"({"axes": [{"field": "x", "range": {"min": 2, "max": 1}}]})", absl::StatusCode::kInvalidArgument,
         "min <= max");
  expect(R"({"samples": 3, "axes": [{"field": "seed", "values": [1]}]})", absl::StatusCode::kInvalidArgument,
         "no axis has a range");
  // A JSON pointer may set an array element or append one, never grow the
  // array further (issue 14: "/tags/20000000" cost 823 MB, 2^62 threw).
  expect(R"({"base": {"tags": ["a"]}, "axes": [{"field": "/tags/20000000", "values": ["x"]}]})",
         absl::StatusCode::kInvalidArgument, "index 20000000 is past the end of an array of 1");
  expect(R"({"base": {"tags": ["a"]}, "axes": [{"field": "/tags/4611686018427387904", "values": ["x"]}]})",
         absl::StatusCode::kInvalidArgument, "is not an array index");
  expect(R"({"base": {"seed": 3}, "axes": [{"field": "/seed/x", "values": [1]}]})", absl::StatusCode::kInvalidArgument,
         "inside a non-message value");
  std::string also = R"({"axes": [{"field": "seed", "values": [1], "also": [)";
  for (int i = 0; i < 65; ++i) also += std::string(i ? "," : "") + "\"name\"";
  expect(also + "]}]}", absl::StatusCode::kInvalidArgument, "sweep.axes[0].also must have at most 64 entries, got 65");
  // NaN and infinities cannot come through JSON but can through the wire:
  // members would have trained with the field's default (issue 14 item 6).
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    v1::SweepSpec sweep = Parse(R"({"axes": [{"field": "training.learning_rate", "values": [0.1]}]})");
    sweep.mutable_axes(0)->add_values()->set_number_value(bad);
    auto r = ExpandSweep(sweep, 8);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("sweep.axes[0].values[1] must be a finite number"), std::string::npos)
        << r.status();
  }
}

TEST(ExpandSweepTest, PointersSetAndAppendArrayElements) {
  auto r = ExpandSweep(Parse(R"({"base": {"tags": ["a"]},
    "axes": [{"field": "/tags/0", "values": ["x"]}, {"field": "/tags/1", "values": ["y"], "also": ["/tags/-"]}]})"), 8);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  const auto& tags = (*r)[0].spec.tags();
  ASSERT_EQ(tags.size(), 3);
  EXPECT_EQ(tags[0], "x");
  EXPECT_EQ(tags[1], "y");
  EXPECT_EQ(tags[2], "y");
}

TEST(SweepRenderTest, CsvTableAndPivot) {
  v1::GetSweepSummaryResponse s;
  s.add_axes("a");
  s.add_columns("pair");
  s.add_columns("acc");
  for (int i = 0; i < 4; ++i) {
    v1::SweepRow* r = s.add_rows();
    r->set_run_id(absl::StrCat("r", i + 1));
    r->set_state(v1::RUN_STATE_SUCCEEDED);
    r->add_swept()->set_number_value(i);
    r->add_values()->set_string_value(i < 2 ? "1-2" : "2,3");
    if (i == 3) {
      r->add_values()->set_null_value(google::protobuf::NULL_VALUE);
    } else {
      r->add_values()->set_number_value(0.25 * i);
    }
  }
  EXPECT_EQ(client::SummaryCsv(s),
            "run_id,state,a,pair,acc\nr1,SUCCEEDED,0,1-2,0\nr2,SUCCEEDED,1,1-2,0.25\nr3,SUCCEEDED,2,\"2,3\",0.5\n"
            "r4,SUCCEEDED,3,\"2,3\",\n");
  EXPECT_NE(client::SummaryTable(s).find("r4   SUCCEEDED  3  2,3   -"), std::string::npos) << client::SummaryTable(s);

  v1::PivotTable p;
  p.set_x("a");
  p.set_y("b");
  p.set_value("pair");
  for (int i = 0; i < 2; ++i) p.add_x_values()->set_number_value(i);
  for (int i = 0; i < 2; ++i) p.add_y_values()->set_number_value(i);
  for (const char* c : {"1-2", "2-3", "1-2", ""}) {
    if (*c) {
      p.add_cells()->set_string_value(c);
    } else {
      p.add_cells()->set_null_value(google::protobuf::NULL_VALUE);
    }
  }
  const std::string text = client::PivotText(p, false);
  // Largest y first; the empty cell prints "-".
  EXPECT_NE(text.find("1 | 1-2  - \n"), std::string::npos) << text;
  EXPECT_NE(text.find("0 | 1-2 2-3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("legend: 1-2 2-3"), std::string::npos) << text;
  const std::string svg = client::PivotSvg(p, "map <1>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("map &lt;1&gt;"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
}

}  // namespace
}  // namespace circuitlab::scheduler
