#pragma once
// Point-to-point operations in the flight recorder, for backends whose send/recv Work only
// learns of its completion when waited on (Gloo's unbound buffers): the operation is recorded
// and marked started when posted, and finished (or failed, with the error) by the first wait()
// or is_completed() that sees it done. The hang report then shows a send/recv still open
// ("rank 1 waits in recv from rank 0 ...") on every path, not only the same-host one.
//
// No sequence number: point-to-point operations are not ordered with the collectives.

#include <cstdint>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/work.hpp"

namespace ddp::detail {

// Records `op` ("send" or "recv") to or from `peer` as started; 0 when `recorder` is null
// (recording off), which record_p2p_completion ignores.
uint64_t record_p2p_started(FlightRecorder* recorder, const char* op, DataType dtype,
                            uint64_t count, int peer);

// `inner`, reporting its outcome to `recorder` entry `record` once. Returns `inner` itself
// when there is nothing to record. As for the operation itself, the group (and so its recorder)
// must outlive the use of the Work; a wait that times out leaves the record open.
WorkPtr record_p2p_completion(FlightRecorder* recorder, uint64_t record, WorkPtr inner);

}  // namespace ddp::detail
