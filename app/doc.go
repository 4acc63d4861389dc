// Package app is where each Sluice process is built: one constructor per
// process, reading top to bottom what it runs.
//
//   - NewWorker: the shared services (services), the senders the
//     configuration names (sender/providers), and the worker on them.
//   - NewAPI: the shared services, the ingest API, and the routes other
//     packages own mounted beside it: the SMS providers' status callbacks
//     and incoming messages (sender/twilio, sender/telnyx, answered by
//     sender/inbound), the email providers' webhooks (webhook/providers),
//     the one-click unsubscribe links, the dashboard. api/doc.go lists
//     every route; TestRoutesDoc checks the list against what NewAPI
//     builds.
//
// Every background part of a process has one shape (internal/lifecycle:
// Start, then Stop); a process's Run starts its parts in order and stops
// them in reverse: worker.Worker.Run and api.Server.Run are those lists.
// Nothing below this package imports it: dependencies point down
// (docs/architecture.md).
package app
