// The OpenAI Files and Batches APIs over BatchStore and BatchRunner:
//   POST /v1/files (multipart: file, purpose=batch), GET /v1/files,
//   GET|DELETE /v1/files/{id}, GET /v1/files/{id}/content,
//   POST /v1/batches, GET /v1/batches (after, limit), GET /v1/batches/{id},
//   POST /v1/batches/{id}/cancel.
// Every file and batch belongs to the owner the caller passes (derived from
// the API key by OpenAiServer); other owners get 404.
//
// Threads: handle() is called on HTTP I/O threads; it does short store calls
// and reads or writes one file, then answers.
#pragma once

#include <memory>
#include <string>

#include "server/api_error.h"
#include "server/batch_runner.h"
#include "server/batch_store.h"
#include "server/http_server.h"

namespace serval::server {

class BatchApi {
 public:
  BatchApi(BatchStore& store, BatchRunner& runner, BatchLimits limits) : store_(store), runner_(runner), limits_(limits) {}

  static bool routes(const std::string& path);  // /v1/files... or /v1/batches...
  void handle(const http::HttpRequest& req, const std::string& owner, const std::shared_ptr<http::ResponseChannel>& ch);

 private:
  void upload(const http::HttpRequest& req, const std::string& owner, const std::shared_ptr<http::ResponseChannel>& ch);
  void create_batch(const http::HttpRequest& req, const std::string& owner,
                    const std::shared_ptr<http::ResponseChannel>& ch);

  BatchStore& store_;
  BatchRunner& runner_;
  BatchLimits limits_;
};

}  // namespace serval::server
