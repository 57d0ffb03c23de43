#include "planner/comm_model.hpp"

namespace longseq {

double collective_bus_factor(Collective collective, int64_t ranks) {
  if (ranks <= 1) return 0;  // nothing leaves the rank
  const double n = static_cast<double>(ranks);
  return collective == Collective::collective_all_reduce ? 2.0 * (n - 1) / n : (n - 1) / n;
}

Link link_for_group(const ClusterSpec& cluster, int64_t group_size) {
  Link link;
  link.latency_us = cluster.hardware.nccl_latency_us;
  if (group_size <= cluster.gpus_per_node) {
    link.busbw_gbps = cluster.hardware.nccl_intranode_busbw_gbps;
  } else {
    // Ring and all-to-all traffic crossing nodes is limited by each GPU's share of the node's
    // network (e.g. EFA v2: 400 GBps per node over 8 GPUs).
    link.busbw_gbps = cluster.hardware.internode_gbps_per_node / static_cast<double>(cluster.gpus_per_node);
    link.crosses_nodes = true;
  }
  return link;
}

double collective_seconds(Collective collective, double bytes, int64_t ranks, const Link& link) {
  if (ranks <= 1 || bytes <= 0) return 0;
  return link.latency_us * 1e-6 + bytes * collective_bus_factor(collective, ranks) / (link.busbw_gbps * 1e9);
}

double ulysses_layer_all_to_all_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp,
                                      int64_t bytes_per_element) {
  if (sp <= 1) return 0;
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seqlen / sp);
  const int64_t replication = kv_replication_factor(model, sp);
  // q, k, v and the output; MLA's v and output heads are v_head_dim wide, its q and k heads head_dim.
  const double out_width = static_cast<double>(model.is_latent_attention() ? model.v_width() : model.q_width());
  const double width = static_cast<double>(model.q_width()) + out_width + static_cast<double>((model.kv_width() + model.v_width()) * replication);
  return tokens * width * static_cast<double>(bytes_per_element);
}

}  // namespace longseq
