// comm_model.hpp: alpha-beta time of NCCL collectives, with nccl-tests' bus-bandwidth factors.
//
// nccl-tests (doc/PERFORMANCE.md) defines algbw = size / time and busbw = algbw * factor, where
// size is the per-rank buffer it reports (all-gather: the gathered output; reduce-scatter: the
// input; all-reduce: the tensor; all-to-all: the send buffer) and factor is (n-1)/n for
// all-to-all, all-gather and reduce-scatter and 2(n-1)/n for all-reduce. A measured busbw is
// therefore the link speed a collective sees: time = latency + size * factor / busbw.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace longseq {

enum class Collective { collective_all_to_all, collective_all_gather, collective_reduce_scatter, collective_all_reduce };

double collective_bus_factor(Collective collective, int64_t ranks);

struct Link {
  double busbw_gbps = 0;
  double latency_us = 0;
  bool crosses_nodes = false;
};

// The link a group of `group_size` consecutive ranks communicates over: NVLink when the group
// fits in one node, otherwise the network, where each GPU gets its node's share.
Link link_for_group(const ClusterSpec& cluster, int64_t group_size);

// Seconds for one collective of `bytes` (nccl-tests size convention) over `ranks` ranks.
double collective_seconds(Collective collective, double bytes, int64_t ranks, const Link& link);

// Bytes one rank sends in the Ulysses all-to-alls of one decoder layer in one direction
// (q, k, v in, output back), with kv heads replicated when sp > n_kv.
double ulysses_layer_all_to_all_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp,
                                      int64_t bytes_per_element);

}  // namespace longseq
