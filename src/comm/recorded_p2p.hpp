#pragma once
// Point-to-point operations in the flight recorder, for every backend, so that the hang report
// shows a send/recv still open ("rank 1 waits in recv from rank 0 ...") on every path:
// - a backend whose send/recv Work only learns of its completion when waited on (Gloo's unbound
//   buffers) records the operation as started when posted (record_p2p_started), and
//   record_p2p_completion marks it finished (or failed, with the error) at the first wait() or
//   is_completed() that sees it done;
// - a backend that runs the operation itself (the cpu backend's same-host queues) records it
//   when posted (record_p2p), and marks it started and finished around the run
//   (record_p2p_start, record_p2p_finished).
//
// No sequence number: point-to-point operations are not ordered with the collectives.
// Every function here records nothing when `recorder` is null (recording off).

#include <cstdint>
#include <exception>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/work.hpp"

namespace ddp::detail {

// Records `op` ("send" or "recv") to or from `peer` (-1: any source) as queued; 0 when
// `recorder` is null.
uint64_t record_p2p(FlightRecorder* recorder, const char* op, DataType dtype, uint64_t count,
                    int peer);

// Marks entry `record` started.
void record_p2p_start(FlightRecorder* recorder, uint64_t record);

// Marks entry `record` completed when `error` is null, else failed with the exception's message
// ("unknown error" for one that is not a std::exception).
void record_p2p_finished(FlightRecorder* recorder, uint64_t record,
                         const std::exception_ptr& error);

// record_p2p, then record_p2p_start: for an operation that runs as soon as it is posted.
uint64_t record_p2p_started(FlightRecorder* recorder, const char* op, DataType dtype,
                            uint64_t count, int peer);

// `inner`, reporting its outcome to `recorder` entry `record` once. Returns `inner` itself
// when there is nothing to record. As for the operation itself, the group (and so its recorder)
// must outlive the use of the Work; a wait that times out leaves the record open.
WorkPtr record_p2p_completion(FlightRecorder* recorder, uint64_t record, WorkPtr inner);

}  // namespace ddp::detail
