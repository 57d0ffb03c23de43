// Sequence-length parsing, hardware cards and runtime profiles.
#include <doctest/doctest.h>

#include "kernels/blocked_attention.hpp"

#include "io/config_error.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/plan.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"

using namespace longseq;

TEST_CASE("sequence lengths: K/M are decimal as the ALST paper writes them, Ki/Mi binary") {
  CHECK(seqlen_parse("32K", "--seqlen") == 32'000);
  CHECK(seqlen_parse("1.5M", "--seqlen") == 1'500'000);
  CHECK(seqlen_parse("3.7m", "--seqlen") == 3'700'000);
  CHECK(seqlen_parse("15000000", "--seqlen") == 15'000'000);
  CHECK(seqlen_parse("128Ki", "--seqlen") == 131'072);
  CHECK(seqlen_parse("4Mi", "--seqlen") == 4'194'304);
  CHECK(seqlen_format(3'700'000) == "3.7M");
  CHECK(seqlen_format(131'072) == "128Ki");
  CHECK(seqlen_format(3'712'000) == "3.712M");
  CHECK(seqlen_format(999) == "999");
  CHECK(seqlen_format(7'143'424) == "7.143M");  // 6976Ki is exact but does not read as a size
}

TEST_CASE("bad sequence lengths name the flag and the reason") {
  CHECK_THROWS_WITH_AS(seqlen_parse("-5", "--seqlen"), doctest::Contains("--seqlen"), ConfigError);
  CHECK_THROWS_WITH_AS(seqlen_parse("abc", "--seqlen"), doctest::Contains("no number"), ConfigError);
  CHECK_THROWS_WITH_AS(seqlen_parse("32X", "--seqlen"), doctest::Contains("unknown suffix"), ConfigError);
  CHECK_THROWS_WITH_AS(seqlen_parse("1.5", "--seqlen"), doctest::Contains("whole number"), ConfigError);
  CHECK_THROWS_WITH_AS(seqlen_parse("1e20", "--seqlen"), doctest::Contains("10^13"), ConfigError);
}

TEST_CASE("hardware cards load with their datasheet values") {
  const HardwareCard h100 = hardware_card_load("H100-SXM-80GB");
  CHECK(h100.gpu_memory_gib == doctest::Approx(81559.0 / 1024.0).epsilon(1e-3));
  CHECK(h100.gpus_per_node == 8);
  CHECK(h100.peak_bf16_tflops == 989);
  CHECK(hardware_card_load("a100-40gb").gpu_memory_gib == 40.0);
  CHECK(hardware_card_load("a100-80gb").gpu_memory_gib == 80.0);
  CHECK(hardware_card_load("h200-141gb").gpu_memory_gib > 140.0);
  // H800: the H100 chip with NVLink cut to 400 GB/s both ways (200 GBps each way).
  const HardwareCard h800 = hardware_card_load("h800-sxm-80gb");
  CHECK(h800.nvlink_gbps == 200);
  CHECK(h800.peak_bf16_tflops == h100.peak_bf16_tflops);
  CHECK(h800.nccl_intranode_busbw_gbps == doctest::Approx(h100.nccl_intranode_busbw_gbps * 200.0 / 450.0));
  CHECK(builtin_hardware_names().size() == 25);  // 23 GPUs and this machine's cpu-device
  // A10: 24 GB GDDR6 = 22.35 GiB, 125 dense BF16 TFLOPS, 600 GB/s (datasheet); one GPU a machine.
  const HardwareCard a10 = hardware_card_load("a10-24gb");
  CHECK(a10.gpu_memory_gib == doctest::Approx(24e9 / 1073741824.0).epsilon(1e-3));
  CHECK(a10.peak_bf16_tflops == 125);
  CHECK(a10.hbm_gbps == 600);
  CHECK(a10.gpus_per_node == 1);
  // FlashAttention-3 (Hopper only): H100's forward 616 and backward 561 TFLOPS combined at FA2's
  // 1 : 2.5 FLOP split; A100 has none, so fa3 there is a named problem.
  CHECK(h100.flash_attention3_tflops_hd128 == doctest::Approx(3.5 / (1.0 / 616 + 2.5 / 561)).epsilon(1e-4));
  CHECK(attention_tflops(h100, 128, "fa3") == doctest::Approx(575.7));
  CHECK(attention_tflops(h100, 128) == 328);
  RuntimeProfile fa3 = runtime_profile_load("deepspeed-hf");
  fa3.attention_kernel = "fa3";
  CHECK(attention_kernel_problem(fa3, h100).empty());
  CHECK(attention_kernel_problem(fa3, hardware_card_load("a100-80gb")).find("Hopper") != std::string::npos);
  CHECK_THROWS_WITH_AS(hardware_card_load("tpu-v5"), doctest::Contains("unknown hardware card 'tpu-v5'"), ConfigError);
}

TEST_CASE("the attention kernel runs the head dims it is compiled for: a head dim between two costs the larger one's time") {
  const HardwareCard h100 = hardware_card_load("h100-sxm-80gb");
  const AttentionKernelFacts &fa2 = attention_kernel_facts("fa2"), &fa3 = attention_kernel_facts("fa3");
  // FlashAttention-2: round_multiple(head_size, 32) up to 128, 64 past it, at most 256 (flash_api.cpp).
  CHECK(attention_kernel_head_dim(fa2, 80) == 96);
  CHECK(attention_kernel_head_dim(fa2, 125) == 128);
  CHECK(attention_kernel_head_dim(fa2, 128) == 128);
  CHECK(attention_kernel_head_dim(fa2, 130) == 192);
  CHECK(attention_kernel_head_dim(fa2, 32) == 32);
  CHECK(attention_kernel_head_dim(fa2, 257) == 0);
  // FlashAttention-3: 64, 96, 128, 192, 256 (hopper/generate_kernels.py).
  CHECK(attention_kernel_head_dim(fa3, 32) == 64);
  CHECK(attention_kernel_head_dim(fa3, 125) == 128);
  CHECK(attention_kernel_head_dim(fa3, 200) == 256);
  // cuDNN's compiled list is in no source: its head dim as given.
  CHECK(attention_kernel_head_dim(attention_kernel_facts("sdpa-cudnn"), 125) == 125);
  // The rate on the model's FLOPs drops by the padding: 125 of 128 columns are the model's.
  CHECK(attention_tflops(h100, 125, "fa3") == doctest::Approx(attention_tflops(h100, 128, "fa3") * 125.0 / 128.0));
  CHECK(attention_tflops(h100, 80) == doctest::Approx(attention_tflops(h100, 96) * 80.0 / 96.0));
  CHECK(attention_tflops(h100, 96) == doctest::Approx(h100.flash_attention_tflops_hd64 +
                                                      (h100.flash_attention_tflops_hd128 - h100.flash_attention_tflops_hd64) * 0.5));
  // So the step's attention time at head_dim 125 is head_dim 128's: the FLOPs shrink by 125/128, the rate too.
  ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = cluster_make(h100, 8, 0, 0, 0);
  RuntimeProfile fa3_profile = runtime_profile_load("deepspeed-hf");
  fa3_profile.attention_kernel = "fa3";
  const PlanOptions plan = PlanOptions::alst(8);
  const double at_128_s = time_predict(model, cluster, plan, fa3_profile, 65536).time.attention_s;
  model.head_dim = 125;
  CHECK(time_predict(model, cluster, plan, fa3_profile, 65536).time.attention_s == doctest::Approx(at_128_s));
  // Past 256 FlashAttention-3 does not run, and nothing takes its place: refused by name, with the
  // source. Under SDPA another backend takes it (the plan's caveat, cli.plan.sdpa_head_dim_past_flash),
  // priced at the head dim as given.
  CHECK(attention_kernel_problem(fa3_profile, h100, 256).empty());
  CHECK(attention_kernel_problem(fa3_profile, h100, 320).find("up to 256 (flash-attn 2.8.3 hopper/generate_kernels.py") !=
        std::string::npos);
  RuntimeProfile sdpa = fa3_profile;
  sdpa.attention_kernel = "sdpa";
  CHECK(attention_kernel_problem(sdpa, h100, 320).empty());
  CHECK(attention_tflops(h100, 320) == attention_tflops(h100, 128));
}

TEST_CASE("the attention kernel: the profile's, else the card's default, and FlashAttention-2 under FPDT and ring") {
  const HardwareCard h100 = hardware_card_load("h100-sxm-80gb"), a100 = hardware_card_load("a100-80gb");
  CHECK(h100.default_attention_kernel == "fa3");
  CHECK(hardware_card_load("h200-141gb").default_attention_kernel == "fa3");
  CHECK(a100.default_attention_kernel == "fa2");
  RuntimeProfile stack = runtime_profile_load("deepspeed-hf");
  CHECK(stack.attention_kernel.empty());  // the card decides
  PlanOptions plan = PlanOptions::alst(8);
  CHECK(attention_kernel_for(stack, h100, plan) == "fa3");
  CHECK(attention_kernel_for(stack, a100, plan) == "fa2");
  stack.attention_kernel = "fa2";  // --attention fa2
  CHECK(attention_kernel_for(stack, h100, plan) == "fa2");
  stack.attention_kernel = "fa3";
  PlanOptions ring = plan;
  ring.sp = 4;
  ring.ring = 2;
  CHECK(attention_kernel_for(stack, h100, ring) == "fa2");  // ring-flash-attention calls flash_attn 2
  PlanOptions fpdt = plan;
  fpdt.fpdt = true;
  CHECK(attention_kernel_for(stack, h100, fpdt) == "fa2");  // so do FPDT's chunks
  // Stacks that pin their kernel keep it on Hopper.
  for (const char* pinned : {"megatron-deepspeed", "native", "native-cuda"}) {
    CAPTURE(pinned);
    CHECK(attention_kernel_for(runtime_profile_load(pinned), h100, plan) == "fa2");
  }
  // A card cannot default to a kernel it has no rate for.
  const std::string card = "name: X\ngpu_memory_gib: 80\npeak_bf16_tflops: 312\ngpus_per_node: 8\nhost_memory_gib: 1000\n"
                           "pcie_host_to_device_gbps: 25\npcie_device_to_host_gbps: 25\nnvlink_gbps: 300\ninternode_gbps_per_node: 100\n"
                           "matmul_achieved_tflops: 271\nflash_attention_tflops_hd128: 190\nflash_attention_tflops_hd64: 160\nhbm_gbps: 2000\n"
                           "nccl_intranode_busbw_gbps: 230\nnccl_latency_us: 20\nhost_memory_gbps: 400\n";
  CHECK(hardware_card_from_text(card, "x.yaml").default_attention_kernel == "fa2");
  CHECK_THROWS_WITH_AS(hardware_card_from_text(card + "default_attention_kernel: fa3\n", "x.yaml"),
                       doctest::Contains("flash_attention3_tflops_hd128"), ConfigError);
  CHECK_THROWS_WITH_AS(hardware_card_from_text(card + "default_attention_kernel: sdpa\n", "x.yaml"),
                       doctest::Contains("expected fa2, fa3 or sdpa-cudnn"), ConfigError);
  // SDPA's default backend: one of SDPA's, with its rate on the card.
  CHECK(hardware_card_from_text(card, "x.yaml").sdpa_default_backend == "fa2");
  CHECK_THROWS_WITH_AS(hardware_card_from_text(card + "sdpa_default_backend: sdpa-cudnn\n", "x.yaml"),
                       doctest::Contains("sdpa_cudnn_tflops_hd128"), ConfigError);
  CHECK_THROWS_WITH_AS(hardware_card_from_text(card + "flash_attention3_tflops_hd128: 500\nflash_attention3_tflops_hd64: 400\n"
                                                      "sdpa_default_backend: fa3\n", "x.yaml"),
                       doctest::Contains("not one of SDPA's backends"), ConfigError);
  const HardwareCard cudnn_card = hardware_card_from_text(
      card + "sdpa_cudnn_tflops_hd128: 400\nsdpa_cudnn_tflops_hd64: 300\nsdpa_default_backend: sdpa-cudnn\n", "x.yaml");
  CHECK(attention_tflops(cudnn_card, 96, "sdpa-cudnn") == doctest::Approx(350));  // halfway between hd64 and hd128
}

TEST_CASE("SDPA: the backend PyTorch picks on the card, and the one PyTorch's context parallelism calls") {
  const HardwareCard h100 = hardware_card_load("h100-sxm-80gb"), a100 = hardware_card_load("a100-80gb");
  // Hopper cards: cuDNN, priced at FlashAttention-3's measured rate; A100: the flash backend (FA2).
  for (const char* hopper : {"h100-sxm-80gb", "h200-141gb", "h800-sxm-80gb"}) {
    CAPTURE(hopper);
    const HardwareCard card = hardware_card_load(hopper);
    CHECK(card.sdpa_default_backend == "sdpa-cudnn");
    CHECK(attention_tflops(card, 128, "sdpa-cudnn") == attention_tflops(card, 128, "fa3"));
    CHECK(attention_tflops(card, 64, "sdpa-cudnn") == attention_tflops(card, 64, "fa3"));
  }
  CHECK(a100.sdpa_default_backend == "fa2");
  const RuntimeProfile accelerate = runtime_profile_load("fsdp2-accelerate");
  CHECK(accelerate.attention_kernel == "sdpa");
  CHECK(runtime_profile_load("fsdp2-torchtitan").attention_kernel == "sdpa");
  PlanOptions plan;
  plan.zero_stage = 3;
  CHECK(attention_kernel_for(accelerate, h100, plan) == "sdpa-cudnn");
  CHECK(attention_kernel_for(accelerate, a100, plan) == "fa2");
  CHECK(attention_kernel_problem(accelerate, a100).empty());
  // Context parallelism calls SDPA (Reference §11 F2.1), not FlashAttention-2 as USP's ring does.
  plan.ring = 8;
  CHECK(attention_kernel_for(accelerate, h100, plan) == "sdpa-cudnn");
  CHECK(attention_kernel_for(accelerate, a100, plan) == "fa2");
  RuntimeProfile flash = accelerate;
  flash.attention_kernel = "fa2";  // --attention fa2: SDPA's flash backend
  CHECK(attention_kernel_for(flash, h100, plan) == "fa2");
  RuntimeProfile outside_sdpa = accelerate;
  outside_sdpa.attention_kernel = "fa3";  // not an SDPA backend: the ring calls SDPA's default
  CHECK(attention_kernel_for(outside_sdpa, h100, plan) == "sdpa-cudnn");
  plan.ring = 1;
  CHECK(attention_kernel_for(outside_sdpa, h100, plan) == "fa3");  // without CP the stack's kernel runs
  // A card without a cuDNN rate names the problem.
  RuntimeProfile cudnn = accelerate;
  cudnn.attention_kernel = "sdpa-cudnn";
  CHECK(attention_kernel_problem(cudnn, h100).empty());
  CHECK(attention_kernel_problem(cudnn, a100).find("cuDNN") != std::string::npos);
  CHECK(attention_kernel_facts("sdpa-cudnn").hf_attn_implementation == "sdpa");
  CHECK_THROWS_AS(attention_kernel_facts("sdpa"), std::invalid_argument);  // a request, resolved per card
}

TEST_CASE("runtime profiles: deepspeed-hf is ALST's 18 bytes per parameter") {
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  CHECK(profile.weight_bytes + profile.gradient_bytes + profile.master_weight_bytes + profile.optimizer_state_bytes == 18);
  CHECK(profile.loss_tiling == LossTiling::loss_tiling_liger);
  const RuntimeProfile native = runtime_profile_load("native");
  CHECK(native.activation_bytes == 4);
  CHECK(native.cuda_context_gib == 0);
  CHECK(native.attention_block_tokens == 0);  // the CPU attention takes no workspace
  // The GPU executor: bf16 activations, 18 bytes per parameter, and the block its attention runs in.
  const RuntimeProfile gpu = runtime_profile_load("native-cuda");
  CHECK(gpu.activation_bytes == 2);
  CHECK(gpu.weight_bytes + gpu.gradient_bytes + gpu.master_weight_bytes + gpu.optimizer_state_bytes == 18);
  CHECK(gpu.attention_block_tokens == kGpuAttentionBlockTokens);
}

TEST_CASE("profile and card files reject unknown keys and bad values") {
  CHECK_THROWS_WITH_AS(hardware_card_from_text("name: x\ngpu_memory_gb: 80\n", "x.yaml"), doctest::Contains("x.yaml"),
                       ConfigError);
  const std::string card =
      "name: x\ngpu_memory_gib: -1\npeak_bf16_tflops: 1\ngpus_per_node: 1\nhost_memory_gib: 1\n"
      "pcie_host_to_device_gbps: 1\npcie_device_to_host_gbps: 1\nnvlink_gbps: 1\ninternode_gbps_per_node: 1\n"
      "matmul_achieved_tflops: 1\nflash_attention_tflops_hd128: 1\nflash_attention_tflops_hd64: 1\nhbm_gbps: 1\n"
      "nccl_intranode_busbw_gbps: 1\nnccl_latency_us: 1\nhost_memory_gbps: 1\n";
  CHECK_THROWS_WITH_AS(hardware_card_from_text(card, "x.yaml"), doctest::Contains("key 'gpu_memory_gib'"), ConfigError);
}

TEST_CASE("--gpu takes the names nvidia-smi prints and the common spellings (issue 40)") {
  CHECK(hardware_name_normalized("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb");
  CHECK(hardware_name_normalized("  nvidia  H100 80GB_HBM3 ") == "h100-80gb-hbm3");
  CHECK(hardware_card_load("a100-sxm4-80gb").name == "A100-80GB");
  CHECK(hardware_card_load("NVIDIA A100-SXM4-40GB").name == "A100-40GB");
  CHECK(hardware_card_load("NVIDIA H100 80GB HBM3").name == "H100-SXM-80GB");
  CHECK(hardware_card_load("NVIDIA H200").name == "H200-141GB");
  // A beginning that two cards share is still asked about, by their file names.
  CHECK_THROWS_WITH_AS(hardware_card_load("a100"), doctest::Contains("did you mean a100-40gb or a100-80gb"), ConfigError);
}

TEST_CASE("the GPUs people own (issue 40): each card's datasheet figures, the names nvidia-smi prints, its rates said to be scaled") {
  struct Datasheet {
    const char* printed_name;  // as nvidia-smi (rocm-smi) prints it
    double memory_gib;         // datasheet GB as GiB, less ECC's 1/16 on data-centre GDDR or the H100's 0.35 GiB driver share
    double dense_bf16_tflops;
    double memory_gbps;
    double gpu_link_gbps;      // each way: NVLink (datasheet both-ways figure / 2), Infinity Fabric, or PCIe
    int64_t gpus_per_node;
  };
  const std::vector<Datasheet> datasheets = {
      {"NVIDIA A800-SXM4-80GB", 80.0, 312, 2039, 200, 8},       // A800 datasheet: NVLink 400 GB/s
      {"NVIDIA H20", 95.65, 148, 4000, 450, 8},                 // H20: 96 GB HBM3, 4.0 TB/s, NVLink 900 GB/s
      {"NVIDIA H100 PCIe", 79.65, 756, 2000, 55.43, 8},         // H100 PCIe: 1,513 sparse, HBM2e 2.0 TB/s
      {"NVIDIA H100 NVL", 93.65, 835, 3900, 55.43, 8},          // H100 NVL: 94 GB, 1,671 sparse, 3.9 TB/s
      {"NVIDIA GH200 480GB", 95.65, 989, 4000, 450, 1},         // GH200: 96 GB HBM3 at 4 TB/s, one GPU a superchip
      {"NVIDIA B200", 179.65, 2250, 8000, 900, 8},              // HGX B200: 36 PF sparse, 64 TB/s, 1.44 TB for 8
      {"NVIDIA GB200", 185.65, 2500, 8000, 900, 72},            // GB200 NVL72: 360 PF sparse, 13.4 TB for 72
      {"NVIDIA L40S", 45.0, 362.05, 864, 27.7, 8},              // L40S: 48 GB GDDR6, 733 sparse
      {"NVIDIA L40", 45.0, 181.05, 864, 27.7, 8},               // L40: 362.1 sparse
      {"NVIDIA L20", 45.0, 119.5, 864, 27.7, 8},                // L20: 239 sparse; USP's rows print 45 GiB
      {"NVIDIA L4", 22.5, 121, 300, 27.7, 8},                   // L4: 24 GB, 242 sparse, 300 GB/s
      {"NVIDIA GeForce RTX 4090", 23.99, 165.2, 1008, 27.7, 8}, // Ada whitepaper: FP32-accumulate rate
      {"NVIDIA GeForce RTX 3090", 23.99, 71, 936, 27.7, 8},     // GA102 whitepaper: FP32-accumulate rate
      {"NVIDIA GeForce RTX 5090", 31.99, 209.5, 1792, 55.43, 8}, // RTX Blackwell whitepaper: FP32-accumulate rate
      {"NVIDIA RTX A6000", 47.98, 154.8, 768, 27.7, 8},         // RTX A6000: 309.7 sparse
      {"NVIDIA RTX 6000 Ada Generation", 45.0, 364.2, 960, 27.7, 8},
      {"AMD Instinct MI300X", 191.65, 1307.4, 5300, 448, 8},    // MI300X: 192 GB, 5.3 TB/s, 7 x 128 GB/s links
      {"AMD Instinct MI325X", 255.65, 1307.4, 6000, 448, 8},    // MI325X: 256 GB, 6 TB/s
  };
  for (const Datasheet& sheet : datasheets) {
    CAPTURE(sheet.printed_name);
    const HardwareCard card = hardware_card_load(sheet.printed_name);
    CHECK(card.gpu_memory_gib == doctest::Approx(sheet.memory_gib).epsilon(1e-3));
    CHECK(card.peak_bf16_tflops == doctest::Approx(sheet.dense_bf16_tflops));
    CHECK(card.hbm_gbps == doctest::Approx(sheet.memory_gbps));
    CHECK(card.nvlink_gbps == doctest::Approx(sheet.gpu_link_gbps));
    CHECK(card.gpus_per_node == sheet.gpus_per_node);
    // No measured rate: scaled, below the peak, and said with every plan (the caveat).
    CHECK_FALSE(card.approximate_rates.empty());
    CHECK(card.matmul_achieved_tflops < card.peak_bf16_tflops);
    CHECK(card.flash_attention_tflops_hd64 < card.flash_attention_tflops_hd128);
  }
  // Ampere and Ada scale the A100's measured share of peak, Hopper the H100 SXM's.
  CHECK(hardware_card_load("l40s-48gb").matmul_achieved_tflops == doctest::Approx(362.05 * 271.2 / 312).epsilon(1e-3));
  CHECK(hardware_card_load("h20-96gb").matmul_achieved_tflops == doctest::Approx(148 * 794.5 / 989).epsilon(1e-3));
  CHECK(hardware_card_load("h20-96gb").default_attention_kernel == "fa3");  // Hopper runs FlashAttention-3
  CHECK(hardware_card_load("b200-180gb").default_attention_kernel == "fa2");  // no Blackwell kernel priced
  // The measured cards carry no such caveat.
  for (const char* measured : {"h100-sxm-80gb", "h200-141gb", "a100-80gb"}) CHECK(hardware_card_load(measured).approximate_rates.empty());
}
