// validation.hpp: the cost model against published measurements.
//
// Reads rows in the format of shared/data/published_points.csv (see its header comment), maps
// each row's features to a plan, predicts each figure the row reports (maximum sequence length,
// peak memory, iteration time, TFLOPS, MFU) and scores it. A row the model cannot express is
// kept, with the reason it was skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/cards.hpp"

namespace longseq {

struct PublishedPoint {
  int64_t line = 0;  // 1-based line in the CSV file
  std::string source, model, gpu_type, features, notes;
  int64_t gpus = 0, nodes = 0, sp = 1;
  int64_t micro_batch = 1;  // sequences per GPU per step (the column is optional; empty = 1)
  double gpu_mem_gib = 0;
  std::optional<int64_t> gpus_per_node;
  std::optional<double> host_mem_gb;  // decimal GB, as the sources print node memory
  std::optional<int64_t> seqlen, seqlen_fail;
  std::optional<double> peak_mem_gib, iter_time_s, tflops, mfu;
  std::string unstated;  // the first of gpus, nodes, sp, gpu_mem_gib the row leaves empty (it is then skipped)
};

// Throws ConfigError("FILE:LINE", column, reason) for a malformed row or a missing column; a row
// that leaves gpus, nodes, sp or gpu_mem_gib empty is kept with `unstated` set.

std::vector<PublishedPoint> published_points_parse(const std::string& csv_text, const std::string& source_name);

// figure_attention_time: an attention kernel benchmark's seconds per iteration (a row whose model
// column reads "attention only: ..."), apart from whole training steps.
enum class FigureKind { figure_max_seqlen, figure_peak_memory, figure_iteration_time, figure_tflops, figure_mfu, figure_attention_time };
const char* figure_kind_name(FigureKind kind);

struct FigureComparison {
  FigureKind kind = FigureKind::figure_max_seqlen;
  double published = 0;
  double published_fail = 0;  // max seqlen only: the smallest length known to fail, 0 if none
  double predicted = 0;
  double relative_error = 0;  // (predicted - reference) / reference; 0 inside a [seqlen, seqlen_fail) bracket
  std::string binding_constraint;  // max seqlen only: what sets the predicted maximum (MaxSeqlenResult)
};

struct PointValidation {
  PublishedPoint point;
  std::string plan;            // the plan the row mapped to, for the report
  std::string profile;         // the runtime profile used, as shown ("deepspeed-hf with FlashAttention-3")
  std::string profile_name;    // the runtime profile's name alone (empty for attention benchmark rows)
  std::string skipped_reason;  // non-empty: no figure was predicted
  std::vector<FigureComparison> figures;
};

// `profile`: the runtime profile for every row; empty means "auto": megatron-deepspeed for FPDT
// rows (FPDT's implementation runs under Megatron-DeepSpeed), deepspeed-hf for the others.
// Rows of ring_published.csv (free-text features) are read too: an attention kernel benchmark
// ("attention only: 32 q / 8 kv d=128" in the model column; "u=2; r=4", or a plain/zigzag/stripe
// ring over the sp column's ranks; "fwd" or "fwd+bwd"; causal) is predicted as such, and so is a
// Megatron run (USP's "Megatron-LM ... tp=; u=; r=", NeMo's "Megatron-Core ... tp=; pp=; cp=; gbs=",
// in FP8 where it says so); another stack's tensor parallelism or FP8, or a model without a card, is
// skipped with the reason.
// `reserve_gib`, when set, replaces the profile's calibrated_reserve_gib (to show the fit and its
// sensitivity, reports/validation.md).
PointValidation point_validate(const PublishedPoint& point, const std::string& profile_name,
                               std::optional<double> reserve_gib = std::nullopt);

// The calibrated reserve fitted to published memory figures (REFERENCE §7.4: what the sourced
// terms leave unexplained is constant in GiB). For each row's maximum sequence length or peak
// memory, the reserves (on a grid of `step_gib` up to `max_gib`) that make its prediction equal the
// published figure, or put it inside the published [fits, fails) bracket, form an interval; the fit
// is the reserve with the least total distance in GiB to the rows' intervals (a median for point
// rows, robust to a few outlying rows). Rows whose figure no reserve in the grid reaches are
// listed as uninformative. The reserve is GPU memory: where a row's predicted maximum is too long
// and set by host memory without a reserve, only a reserve large enough to make the GPU bind first
// brings it in, which says nothing of the GPU's unexplained memory; such an interval starts at 0
// (the row bounds the reserve from above only). One fit per runtime profile, over the rows that
// profile predicts.
struct ReserveEvidence {
  PublishedPoint point;
  FigureKind kind = FigureKind::figure_max_seqlen;
  bool informative = false;
  double low_gib = 0, high_gib = 0;  // the interval of reserves that reproduce the figure
  // > 0: without a reserve host memory set a predicted maximum beyond the published one, and only
  // this reserve brought it in; the interval starts at 0 instead.
  double host_bound_below_gib = 0;
  std::vector<double> relative_errors;  // the figure's error with the reserve at each grid step
};
struct ReserveFit {
  std::string profile;
  double reserve_gib = 0;
  double step_gib = 0;
  std::vector<ReserveEvidence> evidence;
};
std::vector<ReserveFit> reserve_fit(const std::vector<PublishedPoint>& points, double max_gib, double step_gib);

// The median |relative error| of the fit's maximum-length and peak-memory figures with the reserve
// at `reserve_gib` (a grid point of the fit; 0 where the profile has no such figure): how
// sensitive the fit is.
struct ReserveSensitivity {
  double max_seqlen_median_abs_error = 0, peak_memory_median_abs_error = 0;
};
ReserveSensitivity reserve_fit_sensitivity(const ReserveFit& fit, double reserve_gib);

struct FigureSummary {
  FigureKind kind = FigureKind::figure_max_seqlen;
  int64_t count = 0;
  double median_abs_error = 0;
  double worst_abs_error = 0;
  int64_t worst_line = 0;
};

// One summary per figure kind that occurs, in FigureKind order.
std::vector<FigureSummary> validation_summarize(const std::vector<PointValidation>& validations);

}  // namespace longseq
