#include "runtime/ring_nccl.h"

#include <fmt/format.h>

#include <array>
#include <utility>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"

namespace flexjit {

namespace {

using runtime::check_cu;

constexpr int kBytes = static_cast<int>(runtime::NcclType::Uint8);
constexpr int kFloat32 = static_cast<int>(runtime::NcclType::Float32);

const runtime::Nccl& library_for(const std::string& path, std::unique_ptr<runtime::NcclLoad>& own) {
  if (path.empty()) return runtime::nccl();
  own = std::make_unique<runtime::NcclLoad>(runtime::load_nccl(path));
  if (!own->ok) throw Error(own->reason);
  return own->nccl;
}

const runtime::CudaDriver& drv() {
  const runtime::CudaDriver* d = runtime::cuda_driver();
  if (!d) throw Error("no CUDA driver: " + runtime::cuda_driver_unavailable_reason());
  return *d;
}

// The bytes a hop moves of a packet's tensor: the whole dense buffer its view is of (copies_packets), the same size
// on every rank.
size_t extent_bytes(const Tensor& t) { return static_cast<size_t>(t.shape[0] * t.stride(0) * dsl::dtype_size(t.dtype)); }

std::array<Tensor*, 4> parts_of(RingPacket& p) { return {&p.k, &p.v, &p.dk, &p.dv}; }
bool in_parts(size_t i, unsigned parts) { return (i < 2 ? parts & kRingKv : parts & kRingGrads) != 0; }

}  // namespace

runtime::NcclUniqueId nccl_unique_id(const std::string& library) {
  std::unique_ptr<runtime::NcclLoad> own;
  const runtime::Nccl& n = library_for(library, own);
  runtime::NcclUniqueId id{};
  runtime::check_nccl(n, n.ncclGetUniqueId(&id), "making a unique id (ncclGetUniqueId)");
  return id;
}

NcclRingTransport::NcclRingTransport(const NcclRingOptions& options, const runtime::NcclUniqueId& id) {
  if (options.ranks < 1) throw Error(fmt::format("NCCL ring transport: {} ranks; a ring needs at least one process", options.ranks));
  if (options.rank < 0 || options.rank >= options.ranks)
    throw Error(fmt::format("NCCL ring transport: rank {} is not one of the ring's {} ranks (0 to {})", options.rank, options.ranks,
                            options.ranks - 1));
  rank_ = options.rank;
  ranks_ = options.ranks;
  try {
    open(options);
    runtime::ScopedDevice scope(device_);
    check(nccl_->ncclCommInitRank(&comm_, ranks_, id, rank_), "joining the ring's communicator (ncclCommInitRank)");
  } catch (...) {
    release();
    throw;
  }
  owns_comm_ = true;
}

NcclRingTransport::NcclRingTransport(const NcclRingOptions& options, runtime::NcclComm comm) {
  if (!comm) throw Error("NCCL ring transport: no communicator; pass an ncclComm_t, or a unique id to make one");
  try {
    open(options);
    comm_ = comm;
    check(nccl_->ncclCommCount(comm_, &ranks_), "reading the communicator's size (ncclCommCount)");
    check(nccl_->ncclCommUserRank(comm_, &rank_), "reading this process's rank in it (ncclCommUserRank)");
    if (options.ranks != 0 && options.ranks != ranks_)
      throw Error(fmt::format("NCCL ring transport: {} ranks asked for, but the communicator has {}", options.ranks, ranks_));
    if (options.rank != -1 && options.rank != rank_)
      throw Error(fmt::format("NCCL ring transport: rank {} asked for, but this process is rank {} of the communicator", options.rank, rank_));
  } catch (...) {
    release();
    throw;
  }
}

void NcclRingTransport::open(const NcclRingOptions& options) {
  if (options.device < 0)
    throw Error(fmt::format("NCCL ring transport: device {}; give this process's GPU (an ordinal, 0 or more)", options.device));
  nccl_ = &library_for(options.library, own_library_);
  runtime::device_info(options.device);  // throws without a driver, or for a device that does not exist
  device_ = options.device;
  runtime::ScopedDevice scope(device_);
  check_cu(drv().cuStreamCreate(&comm_stream_, CU_STREAM_NON_BLOCKING), "creating the ring's communication stream");
  check_cu(drv().cuEventCreate(&ready_, CU_EVENT_DISABLE_TIMING), "creating the ring's events");
  check_cu(drv().cuEventCreate(&done_, CU_EVENT_DISABLE_TIMING), "creating the ring's events");
}

NcclRingTransport::~NcclRingTransport() { release(); }

void NcclRingTransport::release() {
  const runtime::CudaDriver* d = runtime::cuda_driver();
  if (!d || device_ < 0) return;
  runtime::ScopedDevice scope(device_);
  if (comm_stream_) d->cuStreamSynchronize(comm_stream_);
  if (owns_comm_ && comm_) nccl_->ncclCommDestroy(comm_);
  comm_ = nullptr;
  if (ready_) d->cuEventDestroy_v2(ready_);
  if (done_) d->cuEventDestroy_v2(done_);
  if (comm_stream_) d->cuStreamDestroy_v2(comm_stream_);
  ready_ = done_ = nullptr;
  comm_stream_ = nullptr;
}

void NcclRingTransport::check(int result, const char* what) const { runtime::check_nccl(*nccl_, result, what); }

std::vector<int> NcclRingTransport::local_ranks(int ranks) const {
  if (ranks != ranks_)
    throw Error(fmt::format("ring attention: the ring has {} ranks but the NCCL communicator {}; make RingOptions::ranks the number of "
                            "processes",
                            ranks, ranks_));
  return {rank_};
}

void NcclRingTransport::check_held(const RingHeld& held) const {
  if (held.device.kind != Device::Kind::Cuda || held.device.index != device_)
    throw Error(fmt::format("ring attention: the NCCL transport is on cuda:{} but the ring runs on {}; make RingOptions::device the "
                            "transport's GPU",
                            device_, held.device.str()));
  if (held.packets.size() != 1 || held.streams.size() != 1)
    throw Error(fmt::format("ring attention: internal error, the NCCL transport holds one rank's packet, not {}", held.packets.size()));
}

void NcclRingTransport::attach(RingHeld& held) {
  check_held(held);
  runtime::ScopedDevice scope(device_);
  const std::array<Tensor*, 4> parts = parts_of(held.packets[0]);
  for (size_t i = 0; i < parts.size(); ++i) {
    spare_[i] = nullptr;
    if (!parts[i]->data) continue;
    const size_t bytes = extent_bytes(*parts[i]);
    if (own_[i].bytes() < bytes || !own_[i].data()) {
      if (own_[i].data()) check_cu(drv().cuCtxSynchronize(), "synchronising before growing the ring's buffers");
      own_[i] = runtime::DeviceBuffer(device_, bytes);
    }
    spare_[i] = own_[i].data();
  }
  pending_ = 0;
}

void NcclRingTransport::start(RingHeld& held, unsigned parts) {
  check_held(held);
  runtime::ScopedDevice scope(device_);
  // The transfer waits for the launches enqueued so far: the ones that wrote the outgoing parts (this step's sums)
  // and the last ones that read the buffer the incoming parts land in (the packet held a step ago).
  check_cu(drv().cuEventRecord(ready_, held.streams[0]), "recording a ring hop");
  check_cu(drv().cuStreamWaitEvent(comm_stream_, ready_, 0), "ordering a ring hop");
  const int next = (rank_ + 1) % ranks_, prev = (rank_ + ranks_ - 1) % ranks_;
  const std::array<Tensor*, 4> tensors = parts_of(held.packets[0]);
  check(nccl_->ncclGroupStart(), "starting a hop's group (ncclGroupStart)");
  int result = 0;
  for (size_t i = 0; i < tensors.size() && result == 0; ++i) {
    if (!in_parts(i, parts) || !tensors[i]->data) continue;
    const size_t bytes = extent_bytes(*tensors[i]);
    result = nccl_->ncclSend(tensors[i]->data, bytes, kBytes, next, comm_, comm_stream_);
    if (result == 0) result = nccl_->ncclRecv(spare_[i], bytes, kBytes, prev, comm_, comm_stream_);
  }
  const int ended = nccl_->ncclGroupEnd();  // always, so that a failed send leaves no group open
  check(result, "handing a packet to the next rank (ncclSend / ncclRecv)");
  check(ended, "ending a hop's group (ncclGroupEnd)");
  check_cu(drv().cuEventRecord(done_, comm_stream_), "recording a ring hop");
  pending_ |= parts;
}

void NcclRingTransport::finish(RingHeld& held) {
  if (!pending_) return;
  check_held(held);
  runtime::ScopedDevice scope(device_);
  check_cu(drv().cuStreamWaitEvent(held.streams[0], done_, 0), "waiting for a ring hop");
  RingPacket& p = held.packets[0];
  const std::array<Tensor*, 4> tensors = parts_of(p);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (in_parts(i, pending_) && tensors[i]->data) std::swap(tensors[i]->data, spare_[i]);
  p.owner = (p.owner + ranks_ - 1) % ranks_;
  pending_ = 0;
}

void NcclRingTransport::all_reduce(const Tensor& t, const Device& device, CUstream stream) {
  if (device.kind != Device::Kind::Cuda || device.index != device_)
    throw Error(fmt::format("ring attention: the NCCL transport is on cuda:{} but the gradients are on {}", device_, device.str()));
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  if (n == 0) return;
  runtime::ScopedDevice scope(device_);
  check_cu(drv().cuEventRecord(ready_, stream), "recording the gradients' sum");
  check_cu(drv().cuStreamWaitEvent(comm_stream_, ready_, 0), "ordering the gradients' sum");
  check(nccl_->ncclAllReduce(t.data, t.data, static_cast<size_t>(n), kFloat32, runtime::kNcclSum, comm_, comm_stream_),
        "summing the buffer gradients over the ring (ncclAllReduce)");
  check_cu(drv().cuEventRecord(done_, comm_stream_), "recording the gradients' sum");
  check_cu(drv().cuStreamWaitEvent(stream, done_, 0), "waiting for the gradients' sum");
}

}  // namespace flexjit
