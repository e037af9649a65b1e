#include "parallel/mpi_link.h"

#include <mpi.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "model/batch_forward.h"

namespace serval::parallel {

namespace {

enum Msg : int64_t { kPool = 1, kCopies = 2, kBatch = 3, kStop = 4 };

std::string mpi_error(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, (size_t)len);
}

// Little serializer for the step messages (same binary on every rank).
struct Writer {
  std::vector<uint8_t>* out;
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out->insert(out->end(), p, p + sizeof(T));
  }
  template <class T>
  void put_span(std::span<const T> v) {
    put<int64_t>((int64_t)v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out->insert(out->end(), p, p + v.size() * sizeof(T));
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (at + sizeof(T) > in.size()) { ok = false; return v; }
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> get_vec() {
    const int64_t n = get<int64_t>();
    if (!ok || n < 0 || at + (size_t)n * sizeof(T) > in.size()) { ok = false; return {}; }
    std::vector<T> v((size_t)n);
    std::memcpy(v.data(), in.data() + at, (size_t)n * sizeof(T));
    at += (size_t)n * sizeof(T);
    return v;
  }
};

}  // namespace

Expected<std::unique_ptr<MpiLink>> MpiLink::join(int32_t size, double timeout_s) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided); rc != MPI_SUCCESS)
      return io_error("tensor parallel: MPI_Init_thread failed: " + mpi_error(rc));
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      return io_error("tensor parallel: this MPI does not allow calls from the engine thread (MPI_THREAD_SERIALIZED)");
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != size) {
    MPI_Finalize();
    return invalid_argument("--tp " + std::to_string(size) + " needs as many MPI ranks, this run has " +
                            std::to_string(world) + " (mpirun -np " + std::to_string(size) + " serval ...)");
  }
  return std::unique_ptr<MpiLink>(new MpiLink(rank, size, timeout_s));
}

MpiLink::~MpiLink() {
  if (rank_ == 0 && !stopped_) (void)send_stop();
  MPI_Finalize();
}

Status MpiLink::wait(void* request, bool idle, const char* what) {
  auto* req = static_cast<MPI_Request*>(request);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t polls = 0;; ++polls) {
    int done = 0;
    MPI_Status st;
    if (int rc = MPI_Test(req, &done, &st); rc != MPI_SUCCESS)
      return io_error("tensor parallel: rank " + std::to_string(rank_) + ": " + what + " failed: " + mpi_error(rc));
    if (done) return {};
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!idle && waited > timeout_s_) {
      MPI_Cancel(req);
      return io_error("tensor parallel: rank " + std::to_string(rank_) + " waited " + std::to_string((int)waited) +
                         " s for the other ranks in " + what + " (a rank is gone or stuck)");
    }
    // Spin briefly (a step's exchanges take microseconds), then yield the core.
    if (waited > 0.002) std::this_thread::sleep_for(std::chrono::microseconds(idle ? 500 : 50));
  }
}

Status MpiLink::broadcast(int64_t* type, std::vector<uint8_t>* payload, bool idle) {
  int64_t header[2] = {*type, (int64_t)payload->size()};
  MPI_Request req;
  if (int rc = MPI_Ibcast(header, 2, MPI_INT64_T, 0, MPI_COMM_WORLD, &req); rc != MPI_SUCCESS)
    return io_error("tensor parallel: broadcast failed: " + mpi_error(rc));
  SERVAL_RETURN_IF_ERROR(wait(&req, idle, "the step header broadcast"));
  if (header[1] < 0 || header[1] > (int64_t)1 << 32)
    return io_error("tensor parallel: a step message of " + std::to_string(header[1]) + " bytes");
  *type = header[0];
  payload->resize((size_t)header[1]);
  if (!payload->empty()) {
    if (int rc = MPI_Ibcast(payload->data(), (int)payload->size(), MPI_BYTE, 0, MPI_COMM_WORLD, &req); rc != MPI_SUCCESS)
      return io_error("tensor parallel: broadcast failed: " + mpi_error(rc));
    SERVAL_RETURN_IF_ERROR(wait(&req, false, "the step broadcast"));
  }
  bytes_bcast_ += sizeof header + payload->size();
  return {};
}

Status MpiLink::allgather(const float* in, size_t n, float* out) {
  MPI_Request req;
  if (int rc = MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, MPI_COMM_WORLD, &req); rc != MPI_SUCCESS)
    return io_error("tensor parallel: all-gather failed: " + mpi_error(rc));
  SERVAL_RETURN_IF_ERROR(wait(&req, false, "an all-gather"));
  bytes_gather_ += n * sizeof(float) * (size_t)(size_ - 1);
  return {};
}

Status MpiLink::send_pool(int32_t n_blocks, int32_t block_size, KvType type) {
  std::vector<uint8_t> p;
  Writer w{&p};
  w.put(n_blocks);
  w.put(block_size);
  w.put((int32_t)type);
  int64_t t = kPool;
  return broadcast(&t, &p, false);
}

Status MpiLink::send_copies(std::span<const BlockCopy> copies) {
  std::vector<uint8_t> p;
  Writer{&p}.put_span(copies);
  int64_t t = kCopies;
  return broadcast(&t, &p, false);
}

Status MpiLink::send_batch(const Batch& b) {
  std::vector<uint8_t> p;
  Writer w{&p};
  w.put_span(std::span<const TokenId>(b.tokens));
  w.put<int64_t>((int64_t)b.seqs.size());
  for (const BatchSeq& s : b.seqs) {
    w.put(s.start_pos);
    w.put(s.n_tokens);
    w.put_span(s.block_table);
    w.put_span(s.swa_block_table);
  }
  int64_t t = kBatch;
  return broadcast(&t, &p, false);
}

Status MpiLink::send_stop() {
  stopped_ = true;
  std::vector<uint8_t> p;
  int64_t t = kStop;
  return broadcast(&t, &p, false);
}

Status MpiLink::serve_steps(const Model& shard, ThreadPool* pool) {
  const ModelConfig& c = shard.config();
  std::unique_ptr<KvStorage> kv;
  std::unique_ptr<BatchForward> fwd;
  std::vector<uint8_t> payload;
  std::vector<std::vector<BlockId>> tables, swa_tables;
  Batch batch;
  std::vector<float> logits;
  for (;;) {
    int64_t type = 0;
    SERVAL_RETURN_IF_ERROR(broadcast(&type, &payload, /*idle=*/true));
    Reader r{payload};
    switch (type) {
      case kStop:
        return {};
      case kPool: {
        const int32_t n_blocks = r.get<int32_t>(), block_size = r.get<int32_t>(), kv_type = r.get<int32_t>();
        if (!r.ok) return io_error("tensor parallel: a short pool message");
        auto s = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), block_size, (KvType)kv_type}, n_blocks);
        if (!s.ok()) return s.status();
        kv = std::make_unique<KvStorage>(std::move(s.value()));
        fwd = std::make_unique<BatchForward>(shard, *kv, pool);
        fwd->set_collective(this);
        break;
      }
      case kCopies: {
        const auto copies = r.get_vec<BlockCopy>();
        if (!r.ok || !kv) return io_error("tensor parallel: a bad block-copy message");
        for (const BlockCopy& cp : copies) {
          if (cp.src < 0 || cp.dst < 0 || cp.src >= kv->n_blocks() || cp.dst >= kv->n_blocks())
            return io_error("tensor parallel: a block copy out of range");
          kv->copy_block(cp);
        }
        break;
      }
      case kBatch: {
        if (!fwd) return io_error("tensor parallel: a batch before the pool");
        batch.tokens = r.get_vec<TokenId>();
        const int64_t n_seqs = r.get<int64_t>();
        if (!r.ok || n_seqs < 0 || n_seqs > (int64_t)batch.tokens.size())
          return io_error("tensor parallel: a bad batch message");
        tables.resize((size_t)n_seqs);
        swa_tables.resize((size_t)n_seqs);
        batch.seqs.clear();
        for (int64_t i = 0; i < n_seqs; ++i) {
          const int64_t start = r.get<int64_t>();
          const int32_t n = r.get<int32_t>();
          tables[(size_t)i] = r.get_vec<BlockId>();
          swa_tables[(size_t)i] = r.get_vec<BlockId>();
          // Only rank 0 samples: no output rows here (the output head is skipped).
          batch.seqs.push_back({start, n, tables[(size_t)i], false, 1, false, swa_tables[(size_t)i]});
        }
        if (!r.ok || r.at != payload.size()) return io_error("tensor parallel: a bad batch message");
        SERVAL_RETURN_IF_ERROR(fwd->forward(batch, &logits));
        break;
      }
      default:
        return io_error("tensor parallel: unknown step message " + std::to_string(type));
    }
  }
}

}  // namespace serval::parallel
