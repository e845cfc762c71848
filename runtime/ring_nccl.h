// Ring attention with one process per GPU: the packets hop between the processes by NCCL point-to-point transfers
// (ncclSend to rank + 1 and ncclRecv from rank - 1, grouped per hop with ncclGroupStart / ncclGroupEnd) on a
// communication stream of the transport's own, so that step s computes on the packet in hand while the next one is in
// flight; the buffer gradients are summed across the processes with ncclAllReduce.
//
// Not run yet: this is written against NCCL's C API (runtime/nccl.h, loaded at run time) and unit-tested for what a
// machine without GPUs can check (argument errors, a missing library, a missing driver); no multi-GPU machine has run
// it, and docs/notes/RING_NOTES.md lists those runs as what is left. The in-process transport (ring.h) is what the
// GPU tests and `flexjit run --ring` exercise.
#pragma once
#include <memory>
#include <string>

#include "runtime/device_memory.h"
#include "runtime/nccl.h"
#include "runtime/ring.h"

namespace flexjit {

struct NcclRingOptions {
  int ranks = 0;    // processes in the ring; with an existing communicator 0 takes its size
  int rank = -1;    // this process's rank; with an existing communicator -1 takes its rank there
  int device = -1;  // this process's GPU (the packets' and the launches' device)
  // The NCCL library: empty for the process's (FLEXJIT_NCCL_LIBRARY, else libnccl.so.2 from the loader's path).
  std::string library;
};

// A unique id for a new communicator: one rank makes it, the caller sends it to the others (as PyTorch's process
// groups do), and every rank passes it to NcclRingTransport.
runtime::NcclUniqueId nccl_unique_id(const std::string& library = "");

class NcclRingTransport final : public RingTransport {
 public:
  // Joins a new communicator of options.ranks processes as options.rank; collective: every rank constructs its
  // transport with the same id at the same time, each on its own GPU.
  NcclRingTransport(const NcclRingOptions& options, const runtime::NcclUniqueId& id);
  // Over an existing communicator (an ncclComm_t), which the caller owns and keeps alive longer than this transport.
  NcclRingTransport(const NcclRingOptions& options, runtime::NcclComm comm);
  ~NcclRingTransport() override;
  NcclRingTransport(const NcclRingTransport&) = delete;
  NcclRingTransport& operator=(const NcclRingTransport&) = delete;

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  int device() const { return device_; }

  std::vector<int> local_ranks(int ranks) const override;
  bool copies_packets() const override { return true; }
  void attach(RingHeld& held) override;
  void start(RingHeld& held, unsigned parts) override;
  void finish(RingHeld& held) override;
  void all_reduce(const Tensor& t, const Device& device, CUstream stream) override;

 private:
  void open(const NcclRingOptions& options);  // the library, the device, the stream and events
  void release();  // the communicator (if ours), the stream and events; the constructors' failures too
  void check(int result, const char* what) const;
  void check_held(const RingHeld& held) const;

  std::unique_ptr<runtime::NcclLoad> own_library_;  // when options.library names one
  const runtime::Nccl* nccl_ = nullptr;
  runtime::NcclComm comm_ = nullptr;
  bool owns_comm_ = false;
  int rank_ = -1, ranks_ = 0, device_ = -1;
  CUstream comm_stream_ = nullptr;
  CUevent ready_ = nullptr, done_ = nullptr;  // compute -> communication, communication -> compute
  // Per part (k, v, dk, dv): where the incoming packet lands, swapped with the held packet's memory when a hop
  // finishes, so it points at the transport's own buffer or at the ring's.
  runtime::DeviceBuffer own_[4];
  void* spare_[4] = {};
  unsigned pending_ = 0;            // parts started and not finished
};

}  // namespace flexjit
