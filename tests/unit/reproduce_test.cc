// Recipes (validation, the compiled-in ones) and the checks' evaluation
// (report.h) on hand-made tables: each reduce, aggregates over seeds,
// `needs`, missing values.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/reproduce/render.h"
#include "server/reproduce/recipes.h"
#include "server/reproduce/reproductions.h"
#include "server/reproduce/report.h"

namespace circuitlab::reproduce {
namespace {

template <typename M>
M Parse(const std::string& json) {
  M m;
  auto s = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(s.ok()) << s.ToString() << " in " << json;
  return m;
}

// A 2 x 2 grid (a, b) over two seeds; "pair" labels, "pair_predicted", a
// number column and one series per row.
v1::GetSweepSummaryResponse Grid() {
  return Parse<v1::GetSweepSummaryResponse>(R"({
    "sweep_id": "s1", "axes": ["a", "b", "seed"], "columns": ["pair", "pair_predicted", "acc", "series:loss"],
    "rows": [
      {"run_id": "r1", "swept": [0, 0, 1], "values": ["1-2", "1-2", 0.9, [[0, 3], [10, 2], [20, 1]]]},
      {"run_id": "r2", "swept": [0, 1, 1], "values": ["2-3", "1-2", 0.8, [[0, 3], [10, 2], [20, 2.5]]]},
      {"run_id": "r3", "swept": [1, 0, 1], "values": ["1-2", "1-2", 1.0, null]},
      {"run_id": "r4", "swept": [1, 1, 1], "values": ["MIXED", "2-3", 0.7, null]},
      {"run_id": "r5", "swept": [0, 0, 2], "values": ["1-2", "1-2", 0.5, null]},
      {"run_id": "r6", "swept": [0, 1, 2], "values": ["1-2", "1-2", 0.6, null]},
      {"run_id": "r7", "swept": [1, 0, 2], "values": ["1-2", "1-2", 0.7, null]},
      {"run_id": "r8", "swept": [1, 1, 2], "values": ["1-2", "1-2", null, null]}]})");
}

std::vector<nlohmann::json> Values(const std::string& value_json, const Tables& t, int seeds = 2) {
  std::vector<std::string> why;
  return ValuePerSeed(Parse<v1::RecipeValue>(value_json), t, seeds, &why);
}

TEST(ReproduceReportTest, EachReduceMeasuresPerSeed) {
  const Tables t = {{"plane", Grid()}};
  auto v = Values(R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_DISTINCT",
                                 "unlabelled": ["MIXED"]}})",
                  t);
  EXPECT_EQ(v[0], 2);
  EXPECT_EQ(v[1], 1);
  v = Values(
      R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_LABELLED", "unlabelled": ["MIXED"]}})", t);
  EXPECT_DOUBLE_EQ(v[0].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(v[1].get<double>(), 1.0);
  v = Values(R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_DIFFERENT",
                            "other": "pair_predicted"}})",
             t);
  EXPECT_EQ(v[0], 2);  // r2 and r4
  EXPECT_EQ(v[1], 0);
  // Seed 1: the a = 0 line goes 1-2 -> 2-3 (one change), the b = 0 line stays.
  v = Values(R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_CROSSINGS"}})", t);
  EXPECT_EQ(v[0], 1);
  EXPECT_EQ(v[1], 0);
  v = Values(R"({"column": {"sweep": "plane", "column": "acc", "reduce": "REDUCE_MEAN"}, "offset": -0.1})", t);
  EXPECT_NEAR(v[0].get<double>(), 0.85 - 0.1, 1e-12);
  EXPECT_NEAR(v[1].get<double>(), 0.6 - 0.1, 1e-12);  // the missing cell left out
  v = Values(R"({"column": {"sweep": "plane", "column": "acc", "reduce": "REDUCE_VALUE", "where": {"a": 1, "b": 0}}})",
             t);
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[1], 0.7);
  // Grouped: per a, the distinct labels over b; the most of them.
  v = Values(R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_DISTINCT", "group_by": ["a"],
                            "across": "REDUCE_MAX"}})",
             t);
  EXPECT_EQ(v[0], 2);
  EXPECT_EQ(v[1], 1);
  // A falling series: Spearman -1.
  v = Values(R"({"column": {"sweep": "plane", "column": "series:loss", "reduce": "REDUCE_SPEARMAN_WITH_STEP",
                            "where": {"a": 0, "b": 0}}})",
             t, 1);
  EXPECT_DOUBLE_EQ(v[0].get<double>(), -1.0);
  // First value; first step at 60% of the last |value| (3, 2, 1: step 0).
  v = Values(R"({"column": {"sweep": "plane", "column": "series:loss", "reduce": "REDUCE_SERIES_FIRST",
                            "where": {"a": 0, "b": 1}}, "scale": 2})",
             t, 1);
  EXPECT_EQ(v[0], 6.0);
  v = Values(R"({"column": {"sweep": "plane", "column": "series:loss", "reduce": "REDUCE_SERIES_RISE",
                            "fraction": 0.9, "where": {"a": 0, "b": 1}}})",
             t, 1);
  EXPECT_EQ(v[0], 0.0);  // |3| >= 0.9 * 2.5 at step 0
  v = Values(R"({"column": {"sweep": "plane", "column": "series:loss", "reduce": "REDUCE_SERIES_RISE",
                            "fraction": 1, "where": {"a": 0, "b": 0}}})",
             t, 1);
  EXPECT_EQ(v[0], 0.0);
}

TEST(ReproduceReportTest, ARiseIsTheFirstStepNearTheEndValue) {
  const Tables t = {{"g", Parse<v1::GetSweepSummaryResponse>(R"({
    "axes": ["seed"], "columns": ["trajectory:gamma"],
    "rows": [{"swept": [1], "values": [[[0, 0], [10, -0.05], [20, -0.5], [30, -1.0]]]}]})")}};
  auto v = Values(R"({"column": {"sweep": "g", "column": "trajectory:gamma", "reduce": "REDUCE_SERIES_RISE",
                                 "fraction": 0.1}, "scale": 4})",
                  t, 1);
  EXPECT_EQ(v[0], 80.0);  // 4 x step 20 (|-0.05| < 0.1)
}

TEST(ReproduceReportTest, SlopeOfALogLogFit) {
  // t* = 3 N^2 at N = 4, 8, 16: slope 2.
  const Tables t = {{"n", Parse<v1::GetSweepSummaryResponse>(R"({
    "axes": ["N", "seed"], "columns": ["first"],
    "rows": [{"swept": [4, 1], "values": [48]}, {"swept": [8, 1], "values": [192]}, {"swept": [16, 1], "values": [768]},
             {"swept": [4, 2], "values": [0]}, {"swept": [8, 2], "values": [null]}]})")}};
  std::vector<std::string> why;
  auto v = ValuePerSeed(Parse<v1::RecipeValue>(R"({"column": {"sweep": "n", "column": "first",
                                                   "reduce": "REDUCE_SLOPE_LOGLOG", "other": "N"}})"),
                        t, 2, &why);
  EXPECT_NEAR(v[0].get<double>(), 2.0, 1e-12);
  EXPECT_TRUE(v[1].is_null()) << "no positive value left to fit";
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("seed 2"), std::string::npos) << why[0];
}

// SCIENCE.md G.6's order rule on a 3 x 3 plane: seed 1 is ordered (rank
// falls along a, rises along b, with a compound band and a skipped MIXED
// cell); seed 2 has one cell out of order, which makes one step against
// each axis's direction. The crossings rule counts the ordered map's
// intermediate band as changes.
TEST(ReproduceReportTest, OrderReversalsCountStepsAgainstEachAxissDirection) {
  const Tables t = {{"plane", Parse<v1::GetSweepSummaryResponse>(R"({
    "axes": ["a", "b", "seed"], "columns": ["pair"],
    "rows": [
      {"swept": [0, 0, 1], "values": ["1-3+2-3"]}, {"swept": [0, 1, 1], "values": ["2-3"]},
      {"swept": [0, 2, 1], "values": ["2-3"]},
      {"swept": [1, 0, 1], "values": ["1-2"]}, {"swept": [1, 1, 1], "values": ["1-2+1-3"]},
      {"swept": [1, 2, 1], "values": ["MIXED"]},
      {"swept": [2, 0, 1], "values": ["1-2"]}, {"swept": [2, 1, 1], "values": ["1-2"]},
      {"swept": [2, 2, 1], "values": ["1-2+1-3+2-3"]},
      {"swept": [0, 0, 2], "values": ["2-3"]}, {"swept": [0, 1, 2], "values": ["2-3"]},
      {"swept": [0, 2, 2], "values": ["2-3"]},
      {"swept": [1, 0, 2], "values": ["1-2"]}, {"swept": [1, 1, 2], "values": ["2-3"]},
      {"swept": [1, 2, 2], "values": ["2-3"]},
      {"swept": [2, 0, 2], "values": ["1-2"]}, {"swept": [2, 1, 2], "values": ["1-2"]},
      {"swept": [2, 2, 2], "values": ["1-3"]}]})")}};
  const std::string order = R"(, "order": ["1-2", "1-2+1-3", "1-2+1-3+2-3", "1-3+2-3", "2-3"])";
  auto v = Values(R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_ORDER_REVERSALS",
                                 "unlabelled": ["MIXED"])" + order + "}}",
                  t);
  EXPECT_EQ(v[0], 0) << "an ordered map, its compound band included";
  EXPECT_EQ(v[1], 0) << "1-3 is not ranked, so it is skipped";
  // Seed 2 with the (2, 2) cell ranked low on b's line a = 2 and high on a's
  // line b = 2: put 2-3 at (2, 0) instead of 1-2, against both directions.
  v1::GetSweepSummaryResponse flipped = t.at("plane");
  for (v1::SweepRow& r : *flipped.mutable_rows()) {
    if (r.swept(0).number_value() == 2 && r.swept(1).number_value() == 0 && r.swept(2).number_value() == 2) {
      r.mutable_values(0)->set_string_value("2-3");
    }
  }
  v = Values(R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_ORDER_REVERSALS")" + order + "}}",
             {{"plane", flipped}});
  // Along a at b = 0: 2-3, 1-2, 2-3 (one step against the fall); along b
  // at a = 2: 2-3, 1-2 (one against the rise).
  EXPECT_EQ(v[1], 2);
  v = Values(R"({"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_CROSSINGS",
                            "unlabelled": ["MIXED"]}})",
             t);
  EXPECT_EQ(v[0], 2) << "the ordered map's b = 1 line changes label twice";
}

TEST(ReproduceReportTest, AReportOnlyCheckIsShownAndCountedApart) {
  const Tables t = {{"plane", Grid()}};
  const v1::RecipeScale scale = Parse<v1::RecipeScale>(R"({
    "sweeps": [{"name": "plane"}],
    "checks": [
      {"id": "gate", "value": {"constant": 1}, "comparison": "COMPARISON_EQ", "against": {"constant": 1}},
      {"id": "shown", "report_only": true,
       "value": {"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_DISTINCT", "unlabelled": ["MIXED"]}},
       "comparison": "COMPARISON_GE", "against": {"constant": 2}}]})");
  const v1::ReproductionReport r = EvaluateChecks(scale, t, 2, {});
  ASSERT_EQ(r.checks_size(), 2);
  EXPECT_EQ(r.checks(1).outcome(), v1::CHECK_OUTCOME_REPORTED);
  EXPECT_TRUE(r.checks(1).passed(0));
  EXPECT_FALSE(r.checks(1).passed(1));
  EXPECT_NE(r.checks(1).note().find("outside the reference on seed 2"), std::string::npos) << r.checks(1).note();
  EXPECT_NE(r.checks(1).expected().find("not a gate"), std::string::npos) << r.checks(1).expected();
  EXPECT_EQ(r.passed(), 1u);
  EXPECT_EQ(r.failed(), 0u);
  EXPECT_EQ(r.reported(), 1u);
}

TEST(ReproduceReportTest, ChecksAggregateSeedsAndNeedTheirPrerequisites) {
  const Tables t = {{"plane", Grid()}};
  const v1::RecipeScale scale = Parse<v1::RecipeScale>(R"({
    "sweeps": [{"name": "plane"}],
    "checks": [
      {"id": "two", "value": {"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_DISTINCT",
                                          "unlabelled": ["MIXED"]}},
       "comparison": "COMPARISON_GE", "against": {"constant": 2}},
      {"id": "two_on_average", "value": {"column": {"sweep": "plane", "column": "pair", "reduce": "REDUCE_DISTINCT",
                                                    "unlabelled": ["MIXED"]}},
       "comparison": "COMPARISON_GE", "against": {"constant": 1.5}, "aggregate": "AGGREGATE_MEAN"},
      {"id": "after_two", "value": {"constant": 1}, "comparison": "COMPARISON_EQ", "against": {"constant": 1},
       "needs": ["two"]},
      {"id": "missing", "value": {"column": {"sweep": "plane", "column": "nope"}}, "comparison": "COMPARISON_GE",
       "against": {"constant": 0}},
      {"id": "kept", "value": {"column": {"sweep": "plane", "column": "pair", "where": {"a": 0, "b": 0}}},
       "comparison": "COMPARISON_EQ", "against": {"constant": "1-2"}}]})");
  const v1::ReproductionReport r = EvaluateChecks(scale, t, 2, {"a note"});
  ASSERT_EQ(r.checks_size(), 5);
  EXPECT_EQ(r.checks(0).outcome(), v1::CHECK_OUTCOME_FAIL) << "seed 2 has one label";
  EXPECT_NE(r.checks(0).note().find("failed on seed 2"), std::string::npos) << r.checks(0).note();
  EXPECT_EQ(r.checks(0).expected(), "distinct(plane/pair) >= 2 (every seed)");
  EXPECT_DOUBLE_EQ(r.checks(0).mean(), 1.5);
  EXPECT_EQ(r.checks(1).outcome(), v1::CHECK_OUTCOME_PASS);
  EXPECT_EQ(r.checks(2).outcome(), v1::CHECK_OUTCOME_INCONCLUSIVE);
  EXPECT_NE(r.checks(2).note().find("needs two"), std::string::npos);
  EXPECT_EQ(r.checks(3).outcome(), v1::CHECK_OUTCOME_INCONCLUSIVE);
  EXPECT_NE(r.checks(3).note().find("no column nope"), std::string::npos) << r.checks(3).note();
  EXPECT_EQ(r.checks(4).outcome(), v1::CHECK_OUTCOME_PASS);
  EXPECT_EQ(r.passed(), 2u);
  EXPECT_EQ(r.failed(), 1u);
  EXPECT_EQ(r.inconclusive(), 2u);
  ASSERT_EQ(r.notes_size(), 1);
  EXPECT_TRUE(r.tables().contains("plane"));
}

TEST(ReproduceReportTest, FieldPathsReachIntoAnalysisAnswers) {
  const nlohmann::json doc = nlohmann::json::parse(R"({"circuit_size": 3, "circuit": [
      {"coordinate": {"canonical": "beta"}}, {"coordinate": {"canonical": "alpha"}}, {"coordinate": {}}],
      "effects": [{"accuracy": 0.25}]})");
  EXPECT_EQ(FieldAt(doc, "circuit_size"), 3);
  EXPECT_EQ(FieldAt(doc, "effects.0.accuracy"), 0.25);
  EXPECT_EQ(FieldAt(doc, "circuit.*.coordinate.canonical"), nlohmann::json::array({"beta", "alpha"}));
  EXPECT_TRUE(FieldAt(doc, "effects.1.accuracy").is_null());
  EXPECT_TRUE(FieldAt(doc, "nope").is_null());
  EXPECT_EQ(FieldAt(doc, "circuit.#"), 3);
}

// Rows picked by their fields, as the task-vector recipes read
// AnalyzeTaskVectors' values and E.1 counts coordinates per layer.
TEST(ReproduceReportTest, FieldAtSelectsElementsByTheirFields) {
  const nlohmann::json doc = nlohmann::json::parse(R"({"values": [
      {"name": "p0/resid_ratio", "layer": 1, "position": 4, "value": 0.5},
      {"name": "p0/resid_ratio", "layer": 1, "position": 46, "value": 0.1},
      {"name": "p0/resid_ratio", "layer": 0, "position": 46, "value": 0.9},
      {"name": "a.b", "layer": -1, "position": -1, "value": 7, "gauge": true}]})");
  EXPECT_EQ(FieldAt(doc, "values[name=p0/resid_ratio,layer=1,position=46].value"), 0.1);
  EXPECT_EQ(FieldAt(doc, "values.[name=p0/resid_ratio,layer=1,position=46].value"), 0.1);
  EXPECT_EQ(FieldAt(doc, "values[name=a.b].value"), 7);  // a dot inside brackets does not split
  EXPECT_EQ(FieldAt(doc, "values[gauge=true,layer=-1].value"), 7);
  EXPECT_EQ(FieldAt(doc, "values.*[name=p0/resid_ratio].#"), 3);
  EXPECT_EQ(FieldAt(doc, "values.*[layer=1].position"), nlohmann::json::array({4, 46}));
  EXPECT_TRUE(FieldAt(doc, "values[name=p0/resid_ratio,layer=2].value").is_null());
  EXPECT_TRUE(FieldAt(doc, "values[layer].value").is_null());  // a term without "=" matches nothing
  EXPECT_TRUE(FieldAt(doc, "values[layer=x].value").is_null());
  EXPECT_EQ(FieldAt(doc, "values.*[layer=5].#"), 0);
}

// Issue 51 item 1: a stored report holds at most kMaxReportBytes. The
// largest tables go first (GetSweepSummary answers them again), then the
// largest checks' per-seed values; outcomes, statistics and the notes that
// say what went stay.
TEST(ReproduceReportTest, AReportOverItsBoundLosesTablesThenValuesAndSaysSo) {
  v1::ReproductionReport report;
  const std::string cell(3000, 'x');
  v1::GetSweepSummaryResponse big = Grid(), small = Grid();
  for (int i = 0; i < 300; ++i) big.add_rows()->add_values()->set_string_value(cell);
  (*report.mutable_tables())["big"] = big;
  (*report.mutable_tables())["small"] = small;
  v1::CheckResult* check = report.add_checks();
  check->set_id("wide");
  check->set_outcome(v1::CHECK_OUTCOME_PASS);
  check->set_mean(0.5);
  for (int k = 0; k < 16; ++k) check->add_values()->set_string_value(std::string(20000, 'v'));
  report.add_notes("an earlier note");
  const v1::ReproductionReport whole = report;

  BoundReport(&report, 1 << 20);  // the tables fit without "big"
  EXPECT_LE(report.ByteSizeLong(), 1u << 20);
  EXPECT_FALSE(report.tables().contains("big"));
  EXPECT_TRUE(report.tables().contains("small"));
  EXPECT_EQ(report.checks(0).values_size(), 16) << "values go only when the tables were not enough";
  ASSERT_EQ(report.notes_size(), 2);
  EXPECT_EQ(report.notes(0), "an earlier note");
  EXPECT_NE(report.notes(1).find("table big left out"), std::string::npos) << report.notes(1);
  EXPECT_NE(report.notes(1).find("1048576"), std::string::npos) << report.notes(1);

  report = whole;
  BoundReport(&report, 100000);
  EXPECT_LE(report.ByteSizeLong(), 100000u);
  EXPECT_TRUE(report.tables().empty());
  EXPECT_EQ(report.checks(0).values_size(), 0);
  EXPECT_EQ(report.checks(0).outcome(), v1::CHECK_OUTCOME_PASS);
  EXPECT_DOUBLE_EQ(report.checks(0).mean(), 0.5);
  EXPECT_NE(report.notes(report.notes_size() - 1).find("check wide: its per-seed values left out"), std::string::npos);

  // Notes past the bound: the newest stay (they say what was left out).
  report = whole;
  report.clear_tables();
  report.mutable_checks(0)->clear_values();
  for (int i = 0; i < 5000; ++i) report.add_notes("analysis circuit on r" + std::to_string(i) + ": " + cell);
  BoundReport(&report, 1 << 20);
  EXPECT_LE(report.ByteSizeLong(), 1u << 20);
  EXPECT_NE(report.notes(report.notes_size() - 1).find("earlier notes left out"), std::string::npos);

  report = whole;
  report.clear_tables();
  report.mutable_checks(0)->clear_values();
  const v1::ReproductionReport fits = report;
  BoundReport(&report, 1 << 20);
  EXPECT_EQ(report.SerializeAsString(), fits.SerializeAsString()) << "a report within the bound is left alone";
}

// The least a report holds is known from the recipe: its checks' constants
// once per seed and once in `expected`.
TEST(ReproduceReportTest, AReportsLeastSizeCountsEachConstantPerSeed) {
  v1::RecipeScale scale = Parse<v1::RecipeScale>(R"({"checks": [
      {"id": "a", "description": "four", "value": {"column": {"sweep": "s", "column": "acc"}},
       "against": {"constant": "0123456789"}}]})");
  const int64_t constant = static_cast<int64_t>(scale.checks(0).against().constant().ByteSizeLong());
  EXPECT_EQ(MinReportBytes(scale, 1), 1 + 4 + 2 * constant);
  EXPECT_EQ(MinReportBytes(scale, 16), 1 + 4 + 17 * constant);
}

TEST(ReproduceRecipeTest, ErrorsNameTheField) {
  auto recipe = [](const std::string& scale) {
    return Parse<v1::Recipe>(R"({"id": "X.1", "scales": {"ci": )" + scale + "}}");
  };
  const std::string sweep = R"({"name": "a", "sweep": {"base": {"seed": 1}}})";
  const std::string check = R"({"id": "c", "value": {"constant": 1}, "against": {"constant": 1}})";
  struct Case {
    std::string scale, error;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"sweeps": [{"name": "a", "sweep": {"axes": [{"field": "seed", "values": [1, 2]}]}}], "checks": [)" +
                check + "]}",
            "sweeps the seed"},
           {R"({"sweeps": [)" + sweep + "], \"checks\": []}", "at least one check"},
           {R"({"sweeps": [{"name": "Bad Name"}], "checks": [)" + check + "]}", "sweeps[0].name must be"},
           {R"({"sweeps": [)" + sweep +
                R"(], "analyses": [{"name": "x", "sweep": "b", "label_run": {}}], "checks": [)" + check + "]}",
            "analyses[0].sweep names no sweep"},
           {R"({"sweeps": [)" + sweep +
                R"(], "checks": [{"id": "c", "value": {"column": {"sweep": "zz", "column": "pair"}},
                                  "against": {"constant": 1}}]})",
            "checks[0].value.column.sweep names no sweep"},
           {R"({"sweeps": [)" + sweep + R"(], "checks": [{"id": "c", "value": {"constant": 1},
                 "against": {"constant": 1}, "needs": ["later"]}]})",
            "needs names no earlier check"},
           {R"({"sweeps": [)" + sweep + R"(], "checks": [{"id": "c", "report_only": true, "value": {"constant": 1},
                 "against": {"constant": 1}}, {"id": "d", "value": {"constant": 1}, "against": {"constant": 1},
                 "needs": ["c"]}]})",
            "checks[1].needs names \"c\", a report_only check"},
           {R"({"sweeps": [{"name": "a"}], "checks": [{"id": "c", "value": {"column": {"sweep": "a",
                 "column": "pair", "reduce": "REDUCE_ORDER_REVERSALS"}}, "against": {"constant": 1}}]})",
            "checks[0].value.column.order ranks the labels for REDUCE_ORDER_REVERSALS"},
           {R"({"sweeps": [{"name": "a"}], "checks": [{"id": "c", "value": {"column": {"sweep": "a",
                 "column": "pair", "order": ["1-2"]}}, "against": {"constant": 1}}]})",
            "got 1 with REDUCE_VALUE"},
           {R"({"sweeps": [)" + sweep + R"(], "checks": [)" + check +
                R"(], "figures": [{"kind": "KIND_BARS", "sweep": "zz", "columns": ["x"]}]})",
            "figures[0].sweep names no sweep"},
           {R"({"sweeps": [)" + sweep + R"(], "checks": [)" + check +
                R"(], "figures": [{"kind": "KIND_LABEL_MAP", "sweep": "a", "x": "lr", "columns": ["pair"]}]})",
            "figures[0]: a KIND_LABEL_MAP needs x and y"},
           {R"({"sweeps": [)" + sweep + R"(], "checks": [)" + check +
                R"(], "figures": [{"kind": "KIND_BARS", "sweep": "a", "columns": ["series:train/loss"]}]})",
            "go with KIND_SERIES"},
           {R"({"sweeps": [)" + sweep + R"(], "default_seeds": 17, "checks": [)" + check + "]}", "default_seeds"}}) {
    const absl::Status s = ValidateRecipe(recipe(c.scale));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.scale;
    EXPECT_NE(s.message().find(c.error), std::string::npos) << s.message();
  }
  EXPECT_TRUE(ValidateRecipe(recipe(R"({"sweeps": [)" + sweep + "], \"checks\": [" + check + "]}")).ok());
  // Texts refuse ESC (an OSC sequence would set the reader's terminal
  // title), C1 and bidi characters, wherever they are (issue 51 item 8).
  v1::Recipe texts = recipe(R"({"sweeps": [)" + sweep + "], \"checks\": [" + check + "]}");
  texts.set_title("line one\nline two\twith a tab");
  EXPECT_TRUE(ValidateRecipe(texts).ok());
  for (const std::string& bad : {std::string("\x1b]0;owned\x07"), std::string("\xc2\x9b" "2J"),
                                 std::string("abc\xe2\x80\xaetxt.exe")}) {
    v1::Recipe r = texts;
    r.set_claim(bad);
    absl::Status s = ValidateRecipe(r);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("recipe.claim must not hold control characters"), std::string::npos) << s.message();
    r = texts;
    (*r.mutable_scales())["ci"].mutable_checks(0)->set_description(bad);
    s = ValidateRecipe(r);
    EXPECT_NE(s.message().find("recipe.scales.ci.checks[0].description must not"), std::string::npos) << s;
  }
}

// Issue 51 item 9: one spelling per reproduction id.
TEST(ReproduceRecipeTest, ReproductionIdsAreCanonical) {
  EXPECT_EQ(*ParseReproductionId("p1"), 1);
  EXPECT_EQ(*ParseReproductionId("p120"), 120);
  for (const std::string& bad : {std::string("p+1"), std::string(" 1"), std::string("1"), std::string("p01"),
                                 std::string("p1\0", 3), std::string("P1"), std::string("p"), std::string("p-1"),
                                 std::string("p1 "), std::string("p0"), std::string("p99999999999999999999")}) {
    absl::StatusOr<int64_t> id = ParseReproductionId(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(id.status())) << bad;
  }
}

// Every file under examples/reproduce/ is compiled in, parses and validates
// (a file that did not would be left out of the server's list).
TEST(ReproduceRecipeTest, EveryRecipeFileIsCompiledInAndValid) {
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(CIRCUITLAB_EXAMPLES_DIR "/reproduce")) {
    if (e.path().extension() != ".json") continue;
    ++files;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<v1::Recipe> r = ParseRecipe(text.str(), e.path().filename().string());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(ValidateRecipe(*r).ok()) << ValidateRecipe(*r);
    EXPECT_EQ(e.path().stem().string(), r->id()) << "a recipe's file is named after its id";
    for (const char* scale : {"ci", "cpu", "paper"})
      EXPECT_TRUE(r->scales().contains(scale)) << r->id() << " " << scale;
  }
  EXPECT_GT(files, 0u);
  EXPECT_EQ(BuiltInRecipes().size(), files);
  EXPECT_TRUE(ClaimOrder("E.2", "E.10"));
  EXPECT_FALSE(ClaimOrder("E.10", "E.9"));
  EXPECT_TRUE(absl::IsNotFound(FindRecipe("E.99").status()));
}

// A check that compares with a measured value shows it beside each seed's
// value (the threshold differs by seed); a constant threshold does not.
TEST(ReproduceRenderTest, ChecksAgainstAMeasuredValueShowIt) {
  const auto r = Parse<v1::Reproduction>(R"({"reproduction_id": "p1", "recipe_id": "X.1", "scale": "ci",
    "seeds": 2, "state": "REPRODUCTION_STATE_DONE",
    "recipe": {"id": "X.1", "scales": {"ci": {"checks": [
      {"id": "rises", "value": {"column": {"sweep": "a", "column": "late"}},
       "comparison": "COMPARISON_GT", "against": {"column": {"sweep": "a", "column": "early"}, "offset": 0.1}},
      {"id": "small", "value": {"column": {"sweep": "a", "column": "late"}},
       "comparison": "COMPARISON_LE", "against": {"constant": 1}}]}}},
    "report": {"checks": [
      {"id": "rises", "outcome": "CHECK_OUTCOME_FAIL", "values": [0.99, 0.98], "against": [0.5, 0.995]},
      {"id": "small", "outcome": "CHECK_OUTCOME_PASS", "values": [0.99, 0.98], "against": [1, 1]}]}})");
  const std::string md = reproduce::ReproductionMarkdown(r), text = reproduce::ReproductionText(r);
  EXPECT_NE(md.find("0.99 vs 0.5, 0.98 vs 0.995"), std::string::npos) << md;
  EXPECT_NE(text.find("measured 0.99 vs 0.5, 0.98 vs 0.995"), std::string::npos) << text;
  EXPECT_EQ(md.find("vs 1"), std::string::npos) << "a constant threshold is in Expected: " << md;
}

// A table's axes print whole numbers exactly (a seed is 10086, not
// 1.009e+04, which named every seed of a sweep alike); values keep 4 digits.
TEST(ReproduceRenderTest, AxesPrintWholeNumbersExactly) {
  const auto r = Parse<v1::Reproduction>(R"({"reproduction_id": "p1", "recipe_id": "X.1", "scale": "ci",
    "seeds": 2, "state": "REPRODUCTION_STATE_DONE",
    "report": {"tables": {"a": {"sweep_id": "s1", "axes": ["kappa", "seed"], "columns": ["late"],
      "rows": [{"run_id": "r1", "swept": [8, 10086], "values": [0.123456]},
               {"run_id": "r2", "swept": [0.5, 10087], "values": [12345.6]}]}}}})");
  const std::string md = reproduce::ReproductionMarkdown(r);
  EXPECT_NE(md.find("| 8 | 10086 | 0.1235 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0.5 | 10087 | 1.235e+04 |"), std::string::npos) << md;
}

}  // namespace
}  // namespace circuitlab::reproduce
