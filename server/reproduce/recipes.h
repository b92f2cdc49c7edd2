// Recipes (SCIENCE.md §E as data): the compiled-in ones under
// examples/reproduce/ (one file per claim, a circuitlab.v1.Recipe in
// protobuf's JSON form, embedded by cmake/embed_files.cmake), and the
// checks every recipe passes before a reproduction runs it, whether
// compiled in or sent by a client.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "circuitlab/v1/reproduce.pb.h"
#include "server/common/embedded_file.h"

namespace circuitlab::reproduce {

// examples/reproduce/*.json, by file name ("E.9.json"); generated
// (recipes_embedded.cc, cmake/embed_files.cmake).
std::span<const EmbeddedFile> EmbeddedRecipeFiles();

// The compiled-in recipes, parsed and validated once, in claim order (E.1,
// E.2, ..., E.10, ...). A file that does not parse or validate is a build
// defect: the recipes test fails on it, and the server leaves it out with an
// error in its log.
const std::vector<v1::Recipe>& BuiltInRecipes();
// NotFound naming the recipes there are.
absl::StatusOr<v1::Recipe> FindRecipe(const std::string& id);

// A recipe from its JSON (unknown fields are errors naming them).
absl::StatusOr<v1::Recipe> ParseRecipe(std::string_view json, std::string_view where);
// InvalidArgument naming the field: ids and names, the sweeps (no seed axis:
// the reproduction adds it), what analyses, values and checks refer to.
absl::Status ValidateRecipe(const v1::Recipe& recipe);
// The recipe's scale names, sorted ("ci, cpu, paper").
std::string ScaleNames(const v1::Recipe& recipe);
// Whether `column` of a value names a field of one of the scale's analyses
// (its text before the first '.'); sets *analysis to it when so.
bool IsAnalysisColumn(const v1::RecipeScale& scale, const std::string& column, const v1::RecipeAnalysis** analysis);

// "series:<metric>" and "trajectory:<coordinate>": a whole series per row.
bool IsSeriesColumn(const std::string& column);

// Claim ids in SCIENCE.md's order: "E.2" before "E.10".
bool ClaimOrder(const std::string& a, const std::string& b);

}  // namespace circuitlab::reproduce
