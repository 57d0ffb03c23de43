// Reading published points and scoring predictions against them.
#include <doctest/doctest.h>

#include <algorithm>

#include <string>

#include <fmt/format.h>

#include "io/config_error.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/time_model.hpp"
#include "planner/validation.hpp"

using namespace longseq;

namespace {
const std::string kHeader =
    "# a comment\nsource,model,gpus,gpu_type,gpu_mem_gib,nodes,gpus_per_node,host_mem_gb,features,sp,seqlen,seqlen_fail,"
    "peak_mem_gib,iter_time_s,tflops,mfu,notes\n";

// A ring_published.csv row of a Megatron run, its features in free text: `cluster` is "GPUS,GPU_TYPE,
// GIB,NODES,8", `figures` its "tflops,mfu".
PublishedPoint megatron_row(const std::string& model, const std::string& cluster, const std::string& features, int64_t sp, int64_t seqlen,
                            const std::string& figures) {
  return published_points_parse(kHeader + fmt::format("x,{},{},,\"{}\",{},{},,,,{},\n", model, cluster, features, sp, seqlen, figures), "r.csv")
      .at(0);
}
}

TEST_CASE("the project's copy of published_points.csv parses completely") {
  const auto points = published_points_parse(file_read_text(std::string(LONGSEQ_TEST_DATA_DIR) + "/published_points.csv"), "p.csv");
  CHECK(points.size() == 38);
  CHECK(points.front().model == "Llama-3.1-8B-Instruct");
  CHECK(points.front().iter_time_s.value() == 26);
  CHECK(points.front().line > 1);  // after the comment header
}

TEST_CASE("a malformed row names the file, the line and the column") {
  const std::string bad_number = kHeader + "x,Llama-3.1-8B,eight,H100-SXM,80,1,8,1900,zero3,1,32000,,,,,,\n";
  CHECK_THROWS_WITH_AS(published_points_parse(bad_number, "p.csv"), doctest::Contains("p.csv:3: key 'gpus'"), ConfigError);
  const std::string short_row = kHeader + "x,Llama-3.1-8B,8,H100-SXM,80\n";
  CHECK_THROWS_WITH_AS(published_points_parse(short_row, "p.csv"), doctest::Contains("p.csv:3: 5 fields"), ConfigError);
  const std::string unterminated = kHeader + "x,\"Llama,8,H100-SXM,80,1,8,1900,zero3,1,32000,,,,,,\n";
  CHECK_THROWS_WITH_AS(published_points_parse(unterminated, "p.csv"), doctest::Contains("unterminated"), ConfigError);
  CHECK_THROWS_WITH_AS(published_points_parse("a,b\n1,2\n", "p.csv"), doctest::Contains("header lacks"), ConfigError);
  // Quoted commas are one field.
  const auto quoted = published_points_parse(kHeader + "x,Llama-3.1-8B,8,H100-SXM,80,1,8,1900,zero3,1,32000,,,,,,\"a, b\"\n", "p.csv");
  CHECK(quoted.at(0).notes == "a, b");
}

TEST_CASE("a predicted maximum inside the published bracket has zero error, outside it the nearer bound counts") {
  const std::string profile = "deepspeed-hf";
  auto row = [&](const std::string& seqlen, const std::string& fail) {
    return published_points_parse(kHeader + "x,Llama-3.1-8B,8,H100-SXM,80,1,8,1900,"
                                            "zero3+ac+fa2+opt_offload+tiled_loss+ulysses+tiled_mlp+ckpt_offload,8," +
                                      seqlen + "," + fail + ",,,,,\n",
                                  "p.csv")
        .at(0);
  };
  const PointValidation wide = point_validate(row("1000000", "100000000"), profile);
  REQUIRE(wide.figures.size() == 1);
  CHECK(wide.figures[0].predicted > 1'000'000);
  CHECK(wide.figures[0].relative_error == 0);
  const PointValidation below = point_validate(row("100000000", "200000000"), profile);
  CHECK(below.figures[0].relative_error == doctest::Approx(below.figures[0].predicted / 1e8 - 1));
  const PointValidation above = point_validate(row("1000", "2000"), profile);
  CHECK(above.figures[0].relative_error == doctest::Approx(above.figures[0].predicted / 2000 - 1));
}

TEST_CASE("rows the model cannot express are skipped with the reason") {
  const std::string profile;  // per row
  auto reason = [&](const std::string& model, const std::string& gpu, const std::string& features, const std::string& sp) {
    const auto point = published_points_parse(kHeader + "x," + model + ",8," + gpu + ",80,2,4,1000," + features + "," + sp +
                                                  ",32768,,,,,,\n",
                                              "p.csv")
                           .at(0);
    return point_validate(point, profile).skipped_reason;
  };
  CHECK(reason("Llama-3-8B", "A100", "tp+ac", "1").find("tensor parallelism") != std::string::npos);
  CHECK(reason("Llama-3-8B", "A100", "zero3+warp_drive", "1").find("unknown feature 'warp_drive'") != std::string::npos);
  CHECK(reason("Mystery-9B", "A100", "zero3", "1").find("no model card") != std::string::npos);
  CHECK(reason("Llama-3-8B", "TPU", "zero3", "1").find("no hardware card") != std::string::npos);
  CHECK(reason("Llama-3-8B", "A100", "zero3+ac", "8").find("without the ulysses feature") != std::string::npos);
  CHECK(reason("Llama-3-8B", "A100", "zero3+ac+ulysses", "8").empty());
}

TEST_CASE("the summary reports the median and the worst absolute error per figure") {
  std::vector<PointValidation> validations(3);
  const double errors[] = {-0.10, 0.30, 0.05};
  for (int i = 0; i < 3; ++i) {
    validations[i].point.line = 10 + i;
    validations[i].figures.push_back({FigureKind::figure_iteration_time, 1, 0, 1 + errors[i], errors[i], ""});
  }
  const auto summary = validation_summarize(validations);
  REQUIRE(summary.size() == 1);
  CHECK(summary[0].count == 3);
  CHECK(summary[0].median_abs_error == doctest::Approx(0.10));
  CHECK(summary[0].worst_abs_error == doctest::Approx(0.30));
  CHECK(summary[0].worst_line == 11);
}

TEST_CASE("ring_published.csv: every row parses, and rows that leave a required column empty are kept and skipped by name") {
  const auto points = published_points_parse(file_read_text(std::string(LONGSEQ_TEST_DATA_DIR) + "/ring_published.csv"), "r.csv");
  CHECK(points.size() == 135);
  int64_t unstated = 0, attention = 0;
  for (const PublishedPoint& point : points) {
    const PointValidation validation = point_validate(point, "");
    if (!point.unstated.empty()) {
      ++unstated;
      CHECK(validation.skipped_reason == "the row does not state " + point.unstated);
    }
    if (!validation.figures.empty() && validation.figures[0].kind == FigureKind::figure_attention_time) ++attention;
  }
  CHECK(unstated == 31);
  CHECK(attention == 20);  // ring-flash-attention on A100 and H800, and USP's 8 rows on L20s (a card since issue 40)
}

TEST_CASE("an attention benchmark row: causal FLOPs at the card's FlashAttention rate, the plain ring waiting for its last rank") {
  // ring-flash-attention's README: Llama-3.1-8B's attention (32 q / 8 kv heads, d = 128) over
  // 65,536 tokens on 8 H800s, forward. Each rank computes 2 S^2 d h / 8 FLOPs at 328 TFLOPS (the
  // card's head-dim-128 rate); the key/value blocks (2 x 8,192 tokens x 1,024 x 2 bytes = 33.6 MB)
  // take 0.23 ms each over NVLink (163.2 GBps + 20 us), under the step's 1.7 ms: hidden.
  auto row = [&](const std::string& features, const std::string& seconds) {
    return published_points_parse(kHeader + "x,attention only: Llama-3.1-8B heads (32 q / 8 kv d=128) bs=1,8,H800 80GB NVLink,80,1,8,,"
                                            "\"" + features + "\",8,65536,,," + seconds + ",,,\n",
                                  "r.csv")
        .at(0);
  };
  const double balanced_s = 2.0 * 65536.0 * 65536.0 * 128.0 * 32.0 / 8.0 / 328e12;
  const PointValidation zigzag = point_validate(row("zigzag ring; causal; fwd; bf16", "0.0159"), "");
  REQUIRE(zigzag.figures.size() == 1);
  CHECK(zigzag.figures[0].kind == FigureKind::figure_attention_time);
  CHECK(zigzag.figures[0].predicted == doctest::Approx(balanced_s).epsilon(1e-9));
  CHECK(zigzag.figures[0].relative_error == doctest::Approx(balanced_s / 0.0159 - 1.0).epsilon(1e-9));
  CHECK(zigzag.plan == "attention only: sp=1 ring=8, fwd");
  // The plain ring: its last rank computes r - 1/2 blocks against the balanced r/2, 1.875x at r = 8.
  const PointValidation basic = point_validate(row("basic ring; causal; fwd; bf16", "0.026"), "");
  CHECK(basic.figures[0].predicted == doctest::Approx(1.875 * balanced_s).epsilon(1e-9));
  // Forward and backward: 1 + 2.5 forward passes (FlashAttention-2's backward); the backward's
  // passing (blocks plus fp32 dk/dv accumulators) still hides, but for the accumulators' last hop
  // home (2 x 8,192 x 1,024 x 4 bytes over 163.2 GBps, + 20 us).
  const PointValidation both = point_validate(row("zigzag ring; causal; fwd+bwd; bf16", "0.0575"), "");
  CHECK(both.figures[0].predicted == doctest::Approx(3.5 * balanced_s + 20e-6 + 2.0 * 8192.0 * 1024.0 * 4.0 / 163.2e9).epsilon(1e-9));
  // Ulysses inside: u = 2, r = 4 adds the all-to-alls, so it is slower than the pure ring here.
  const PointValidation hybrid = point_validate(row("u=2; r=4; zigzag; causal; fwd", "0.02"), "");
  CHECK(hybrid.plan == "attention only: sp=2 ring=4, fwd");
  CHECK(hybrid.figures[0].predicted > balanced_s);
  CHECK(point_validate(row("zigzag ring; fwd", "0.02"), "").skipped_reason.find("only causal") != std::string::npos);
  CHECK(point_validate(row("u=2; r=2; causal; fwd", "0.02"), "").skipped_reason.find("is not the row's 8 GPUs") != std::string::npos);
}

TEST_CASE("an fa3 row is predicted with FlashAttention-3, on Hopper only") {
  auto row = [&](const std::string& gpu, const std::string& kernel) {
    return published_points_parse(kHeader + "x,Llama-3.1-8B,8," + gpu + ",80,1,8,1900,zero3+ac+" + kernel +
                                      "+opt_offload+tiled_loss+ulysses+tiled_mlp+ckpt_offload,8,1000000,,,600,,,measured_at\n",
                                  "p.csv")
        .at(0);
  };
  const PointValidation fa2 = point_validate(row("H100-SXM", "fa2"), "");
  const PointValidation fa3 = point_validate(row("H100-SXM", "fa3"), "");
  REQUIRE(fa3.skipped_reason.empty());
  CHECK(fa3.profile == "deepspeed-hf with FlashAttention-3");
  REQUIRE(fa3.figures.size() == 1);
  CHECK(fa3.figures[0].predicted < 0.7 * fa2.figures[0].predicted);  // attention dominates at 1M tokens: 328 -> 575.7 TFLOPS
  CHECK(point_validate(row("A100", "fa3"), "").skipped_reason.find("Hopper") != std::string::npos);
}

TEST_CASE("free-text training rows name what is not modelled") {
  auto reason = [&](const std::string& features) {
    const auto point = published_points_parse(kHeader + "x,Llama-3-8B,8,A100,80,1,8,,\"" + features + "\",2,32768,,,1.0,,,\n", "r.csv").at(0);
    return point_validate(point, "").skipped_reason;
  };
  CHECK(reason("torchtitan; tp=4; cp=2") == "tensor parallelism (tp=4) outside Megatron is not modelled");
  CHECK(reason("torchtitan; Float8 linears; FSDP2=4; cp=2") == "FP8 outside Megatron-Core (torchtitan's Float8 linears: torchao's) is not modelled");
  // Megatron's FP8 is TE's, on a card with FP8 tensor cores (the row's A100 has none).
  CHECK(reason("NeMo; Megatron-Core CP; FP8; tp=1; cp=2").find("plan: --fp8: A100-80GB's card gives no FP8 tensor rate") == 0);
  CHECK(reason("Megatron-LM@x; FP8; tp=2; u=1; r=2").find("plan: --fp8:") == 0);
  CHECK(reason("JAX ring attention; FSDP") == "features in free text: longseq reads them for attention kernel benchmarks only");
  CHECK(reason("Megatron-LM@x + yunchang USP; tp=2; u=1; r=2; pp=2") == "");  // pipeline stages are planned
  CHECK(reason("NeMo; Megatron-Core CP; tp=2; pp=1; dp=3; cp=2") == "dp=3 is not the 8 GPUs' share left by tp x cp x pp");
  CHECK(reason("NeMo; Megatron-Core; tp=2") == "Megatron row: no 'tp=N' with 'u=N; r=N' or 'cp=N'");
}

TEST_CASE("a NeMo row (Megatron-Core in FP8) is planned with its tp, cp, pp and global batch, says what it assumed, and predicts TFLOPS") {
  // NeMo's Llama2-7B table's shape: 32 H100s, tp=2 x cp=2 x dp=8, FP8, a global batch of 128 samples of 32K.
  const PublishedPoint point = megatron_row("Llama2-7B", "32,H100-SXM-80GB (DGX-H100),80,4,8",
                                            "NeMo 24.03.01; Megatron-Core CP (ring P2P; TE); FP8; tp=2; pp=1; dp=8; cp=2; gbs=128 (4M tokens/step)",
                                            2, 32'768, "610,");
  const PointValidation validation = point_validate(point, "");
  REQUIRE(validation.skipped_reason.empty());
  CHECK(validation.plan == "tp=2 sp=1 ring=2 zero=1 -checkpointing +fp8 global-batch=128");
  CHECK(validation.profile.find("recompute unstated: none (it fits)") != std::string::npos);
  CHECK(validation.profile.find("micro batch 1 (unstated)") != std::string::npos);
  CHECK(validation.profile.find("FP8 GEMMs at an approximate rate") != std::string::npos);
  REQUIRE(validation.figures.size() == 1);
  CHECK(validation.figures[0].kind == FigureKind::figure_tflops);
  // The TFLOPS: the plan's causal model FLOPs a second, as its MFU over the H100's 989 says.
  const ModelSpec model = model_load("llama-2-7b");
  PlanOptions plan;
  plan.tp = 2;
  plan.ring = 2;
  plan.zero_stage = 1;
  plan.activation_checkpointing = false;
  plan.fp8 = true;
  plan.global_batch = 128;
  const TimePrediction time = time_predict(model, cluster_make(hardware_card_load("h100-sxm-80gb"), 32, 4, 8, 0), plan,
                                           runtime_profile_load("megatron-core"), 32'768);
  CHECK(time.accumulation_steps == 16);  // 128 samples over 8 data-parallel ranks
  CHECK(validation.figures[0].predicted == doctest::Approx(time.mfu * 989.0));
}

TEST_CASE("Llama 3's 405B rows (Meta's 4D stack) are priced in Megatron-Core's layout, all-gather context parallelism where it says so") {
  auto row = [&](int64_t gpus, const std::string& layout, int64_t cp, int64_t seqlen) {
    return megatron_row("Llama3-405B (126L h16384 128q/8kv)", fmt::format("{},H100-SXM-80GB HBM3 700W,80,{},8", gpus, gpus / 8),
                        "Meta 4D: tp=8; " + layout + "; BF16", cp, seqlen, "400,0.4");
  };
  const PointValidation short_rows = point_validate(row(8192, "cp=1 (all-gather KV CP); pp=16 (interleaved); dp=64 (FSDP); batch/DP=32", 1, 8192), "");
  REQUIRE(short_rows.skipped_reason.empty());
  // 32 samples a data-parallel rank over 64 of them; the uneven 7 + 8 x 14 + 7 stages run 1F1B.
  CHECK(short_rows.plan == "tp=8 pp=16 sp=1 zero=1 +checkpointing global-batch=2048");
  CHECK(short_rows.profile.find("Meta's 4D stack priced as Megatron-Core's layout") != std::string::npos);
  const PointValidation long_rows = point_validate(row(16384, "cp=16 (all-gather KV CP); pp=16 (interleaved); dp=8 (FSDP); batch/DP=16", 16, 131'072), "");
  REQUIRE(long_rows.skipped_reason.empty());
  CHECK(long_rows.plan == "tp=8 pp=16 sp=1 ring=16 zero=1 +checkpointing cp-comm=all_gather global-batch=128");
  CHECK(long_rows.profile.find("its all_gather context parallelism") != std::string::npos);
}

TEST_CASE("a Megatron-LM row with tp, u and r in free text is predicted as Megatron-Core's plan: its MFU, and TFLOPS of causal FLOPs") {
  // USP's Table 6 shape: Llama3-8B on 16 A800s, tp=4 x u=2 x r=2, ZeRO-1, no recompute, 64K.
  const PublishedPoint point = megatron_row("Llama3-8B (32L h4096 32q/8kv heads)", "16,A800-SXM4-80GB,80,2,8",
                                            "Megatron-LM@2196398 + yunchang USP; ZeRO-1 over DP+SP; TP-sp on; no act-recompute; bf16; tp=4; u=2; "
                                            "r=2; dp=1; pp=1; gbs=1",
                                            4, 65'536, "122.45,0.39");
  const PointValidation validation = point_validate(point, "");
  REQUIRE(validation.skipped_reason.empty());
  CHECK(validation.plan == "tp=4 sp=2 ring=2 zero=1 -checkpointing");
  CHECK(validation.profile_name == "megatron-core");
  REQUIRE(validation.figures.size() == 2);
  CHECK(validation.figures[0].kind == FigureKind::figure_tflops);
  CHECK(validation.figures[1].kind == FigureKind::figure_mfu);
  // The TFLOPS the row prints are its MFU's: causal model FLOPs a second over the A800's 312 TFLOPS peak.
  CHECK(validation.figures[0].predicted == doctest::Approx(validation.figures[1].predicted * 312.0));
}

TEST_CASE("the reserve fit: a row host memory holds too long bounds the GPU reserve from above only") {
  // FPDT, Llama-3-8B on 8 A100-80GB: host memory sets the predicted maximum (6.36M, FPDT Table 1's
  // row). Against a made-up bracket [2Mi, 4Mi) it is too long, and only a GPU reserve that makes
  // the GPU bind first brings it in: that reserve is no evidence, so the interval starts at 0.
  const std::string row = "x,Llama-3-8B,8,A100,80,2,4,1000,zero3+ac+ckpt_offload+ulysses+fpdt,8,2097152,4194304,,,,,max context\n";
  const auto points = published_points_parse(kHeader + row, "p.csv");
  const PointValidation base = point_validate(points.at(0), "", 0.0);
  REQUIRE(base.figures.size() == 1);
  CHECK(base.figures[0].binding_constraint == "host memory");
  CHECK(base.figures[0].relative_error > 0);
  const std::vector<ReserveFit> fits = reserve_fit(points, 40.0, 0.5);
  REQUIRE(fits.size() == 1);
  REQUIRE(fits[0].evidence.size() == 1);
  const ReserveEvidence& evidence = fits[0].evidence[0];
  CHECK(evidence.informative);
  CHECK(evidence.low_gib == 0);
  CHECK(evidence.host_bound_below_gib > 10);  // the GPU needs a large reserve to bind first
  CHECK(evidence.high_gib >= evidence.host_bound_below_gib);
  CHECK(fits[0].reserve_gib == 0);
  // The same model on 40 GB cards (FPDT Table 1: [1Mi, 2Mi)) is GPU-bound: its interval's low end
  // stands.
  const auto gpu_bound = published_points_parse(
      kHeader + "x,Llama-3-8B,8,A100,40,2,4,1000,zero3+ac+ckpt_offload+ulysses+fpdt,8,1048576,2097152,,,,,max context\n", "p.csv");
  CHECK(point_validate(gpu_bound.at(0), "", 0.0).figures.at(0).binding_constraint == "GPU memory");
  const std::vector<ReserveFit> gpu_bound_fits = reserve_fit(gpu_bound, 40.0, 0.5);
  const ReserveEvidence& standing = gpu_bound_fits.at(0).evidence.at(0);
  CHECK(standing.host_bound_below_gib == 0);
  CHECK(standing.low_gib > 0);
}

TEST_CASE("the profiles' calibrated reserves are what the fit to the seed set gives (fitted once, not tuned by hand)") {
  const auto points = published_points_parse(file_read_text(std::string(LONGSEQ_TEST_DATA_DIR) + "/published_points.csv"), "p.csv");
  const std::vector<ReserveFit> fits = reserve_fit(points, 40.0, 0.5);
  REQUIRE(fits.size() == 3);  // deepspeed-hf, megatron-deepspeed, fsdp2-accelerate
  for (const ReserveFit& fit : fits) {
    CAPTURE(fit.profile);
    int informative = 0;
    for (const ReserveEvidence& evidence : fit.evidence) informative += evidence.informative ? 1 : 0;
    // A fit to many rows sets the profile's reserve; a stack with a row or two (FSDP2's one TRL
    // run) carries none, whatever a fit to them would say.
    if (informative >= 10) CHECK(fit.reserve_gib == runtime_profile_load(fit.profile).calibrated_reserve_gib);
    else CHECK(runtime_profile_load(fit.profile).calibrated_reserve_gib == 0);
  }
  CHECK(std::count_if(fits.begin(), fits.end(), [](const ReserveFit& fit) { return fit.reserve_gib > 0; }) == 2);
}

TEST_CASE("adapter, 8-bit AdamW and unstated-ZeRO rows are predicted with the plan they name, and say what they assumed") {
  auto validate = [](const std::string& features, const std::string& notes) {
    const auto point = published_points_parse(kHeader + "x,Llama-3.1-8B-Instruct,1,H100-SXM,80,1,8,," + features +
                                                  ",1,65536,,,,,," + notes + "\n",
                                              "p.csv")
                           .at(0);
    return point_validate(point, "");
  };
  // QLoRA with its rank in the notes: the HF Trainer / TRL stack, no assumption said.
  const PointValidation qlora = validate("qlora+ac+fa2+ckpt_offload", "r=32 all-linear");
  CHECK(qlora.skipped_reason.empty());
  CHECK(qlora.profile_name == "hf-trainer");
  CHECK(qlora.plan.find("+qlora(r=32)") != std::string::npos);
  CHECK(qlora.profile.find("assumed") == std::string::npos);
  // LoRA with nothing stated: rank 16 on every linear, said.
  const PointValidation lora = validate("lora+ac+fa2+hf_bf16", "");
  CHECK(lora.plan.find("+lora(r=16)") != std::string::npos);
  CHECK(lora.profile.find("LoRA rank 16 assumed") != std::string::npos);
  CHECK(validate("lora+ac+fa2", "\"q_proj,v_proj rank 8\"").plan.find("+lora(r=8, q/v)") != std::string::npos);
  // 8-bit AdamW on the pure-bf16 Trainer; with ZeRO (DeepSpeed) it is not modelled: skipped by name.
  CHECK(validate("hf_bf16+ac+fa2+adam8bit", "").plan.find("+adam-8bit") != std::string::npos);
  CHECK(validate("zero3+ac+fa2+adam8bit", "").skipped_reason.find("8-bit AdamW beside ZeRO") != std::string::npos);
  // LoRA under ZeRO-3 is DeepSpeed's (the adapters trained as any parameter), and since issue 40 so
  // is a 4-bit base partitioned by ZeRO-3 (bf16 quant storage) and adapters beside ZeRO offload.
  const PointValidation sharded = validate("zero3+ac+fa2+lora", "");
  CHECK(sharded.skipped_reason.empty());
  CHECK(sharded.profile_name == "deepspeed-hf");
  const PointValidation sharded_nf4 = validate("zero3+ac+fa2+qlora", "");
  CHECK(sharded_nf4.skipped_reason.empty());
  CHECK(sharded_nf4.plan.find("zero=3") != std::string::npos);
  CHECK(sharded_nf4.plan.find("+qlora(") != std::string::npos);
  const PointValidation offloaded = validate("zero3+ac+fa2+lora+opt_offload", "");
  CHECK(offloaded.skipped_reason.empty());
  CHECK(offloaded.plan.find("+optimizer-offload") != std::string::npos);
  // An unstated ZeRO stage is priced as stage 3, and the row says so.
  const PointValidation unstated = validate("zero_unstated+ac+fa2+opt_offload", "");
  CHECK(unstated.skipped_reason.empty());
  CHECK(unstated.plan.find("zero=3") != std::string::npos);
  CHECK(unstated.profile.find("ZeRO stage 3 assumed") != std::string::npos);
}

TEST_CASE("the micro_batch column: read where the header has it (empty = 1), and the row predicted with that many sequences") {
  const std::string header = "source,model,gpus,gpu_type,gpu_mem_gib,nodes,gpus_per_node,host_mem_gb,features,sp,seqlen,seqlen_fail,"
                             "peak_mem_gib,iter_time_s,tflops,mfu,notes,micro_batch\n";
  const std::string row = "x,Qwen3-4B,4,H100-SXM,80,1,,,zero3+ac+fa2+opt_offload+ulysses,4,32768,,35.0,,,,n,";
  const auto points = published_points_parse(header + row + "\n" + row + "2\n", "p.csv");
  CHECK(points.at(0).micro_batch == 1);
  CHECK(points.at(1).micro_batch == 2);
  CHECK_THROWS_WITH_AS(published_points_parse(header + row + "0\n", "p.csv"), doctest::Contains("p.csv:2: key 'micro_batch'"), ConfigError);
  const PointValidation one = point_validate(points.at(0), "deepspeed-hf"), two = point_validate(points.at(1), "deepspeed-hf");
  auto peak = [](const PointValidation& validation) {
    for (const FigureComparison& figure : validation.figures)
      if (figure.kind == FigureKind::figure_peak_memory) return figure.predicted;
    return 0.0;
  };
  // Two sequences a GPU hold more activations than one; the model states are the same.
  CHECK(peak(one) > 0);
  CHECK(peak(two) > peak(one));
  // Without the column (the older layout), every row is one sequence a GPU.
  CHECK(published_points_parse(kHeader + "x,Qwen3-4B,4,H100-SXM,80,1,,,zero3,4,32768,,35.0,,,,n\n", "p.csv").at(0).micro_batch == 1);
}
