// NCCL, loaded at run time with dlopen("libnccl.so.2") as the driver is (runtime/cuda_driver.h), so flexjit builds
// and runs without NCCL and only the multi-GPU ring (issue 28) needs it. nccl.h is not a build dependency: the few
// types and entry points the ring uses are declared here with NCCL's C ABI (stable since NCCL 2.0; ncclSend /
// ncclRecv since 2.7, ncclBfloat16 since 2.10).
#pragma once
#include <cuda.h>

#include <cstddef>
#include <string>

namespace flexjit::runtime {

// ncclUniqueId: the opaque bytes one rank creates and the caller distributes to the others (as PyTorch and serving
// stacks do), from which every rank joins the communicator.
struct NcclUniqueId {
  char internal[128];
};
using NcclComm = struct ncclComm*;  // ncclComm_t

// ncclDataType_t values (nccl.h).
enum class NcclType : int {
  Int8 = 0,
  Uint8 = 1,
  Int32 = 2,
  Uint32 = 3,
  Int64 = 4,
  Uint64 = 5,
  Float16 = 6,
  Float32 = 7,
  Float64 = 8,
  Bfloat16 = 9,
};
constexpr int kNcclSum = 0;  // ncclRedOp_t ncclSum

// Every NCCL entry point flexjit uses: X(name, return type, parameters). Each returns an ncclResult_t (an int,
// 0 on success) but ncclGetErrorString.
#define FLEXJIT_NCCL_ENTRY_POINTS(X)                                                                          \
  X(ncclGetVersion, int, (int* version))                                                                      \
  X(ncclGetUniqueId, int, (NcclUniqueId * id))                                                                \
  X(ncclCommInitRank, int, (NcclComm * comm, int nranks, NcclUniqueId id, int rank))                          \
  X(ncclCommInitAll, int, (NcclComm * comms, int ndev, const int* devlist))                                   \
  X(ncclCommDestroy, int, (NcclComm comm))                                                                    \
  X(ncclCommCount, int, (NcclComm comm, int* count))                                                          \
  X(ncclCommUserRank, int, (NcclComm comm, int* rank))                                                        \
  X(ncclSend, int, (const void* buf, size_t count, int type, int peer, NcclComm comm, CUstream stream))       \
  X(ncclRecv, int, (void* buf, size_t count, int type, int peer, NcclComm comm, CUstream stream))             \
  X(ncclAllReduce, int, (const void* send, void* recv, size_t count, int type, int op, NcclComm comm, CUstream stream)) \
  X(ncclGroupStart, int, ())                                                                                  \
  X(ncclGroupEnd, int, ())                                                                                    \
  X(ncclGetErrorString, const char*, (int result))

struct Nccl {
#define FLEXJIT_NCCL_MEMBER(name, ret, params) ret(*name) params = nullptr;
  FLEXJIT_NCCL_ENTRY_POINTS(FLEXJIT_NCCL_MEMBER)
#undef FLEXJIT_NCCL_MEMBER
  int version = 0;   // ncclGetVersion's: major * 10000 + minor * 100 + patch
  std::string path;  // what was opened
};

// One attempt at loading NCCL from `path` (a file, or a name the dynamic loader searches for): ok, or the reason.
struct NcclLoad {
  Nccl nccl;
  bool ok = false;
  std::string reason;
};
NcclLoad load_nccl(const std::string& path);

// The library, loaded once per process: libnccl.so.2 from the loader's search path, or the file FLEXJIT_NCCL_LIBRARY
// names. Throws flexjit::Error saying what is missing and how to provide it (a library that cannot be opened, an
// entry point it lacks, a version below 2.10).
const Nccl& nccl();
// Whether nccl() would succeed; if not and `why` is given, the reason.
bool nccl_available(std::string* why = nullptr);
// Throws flexjit::Error naming `what` and NCCL's own text unless `result` is 0 (ncclSuccess); the text from `library`
// (default: the process-wide one).
void check_nccl(int result, const char* what);
void check_nccl(const Nccl& library, int result, const char* what);

}  // namespace flexjit::runtime
