/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_AUDIT_H
#define AIRLOCK_AUDIT_H

/*
 * audit: the per-workspace record behind `airlock audit`.
 *
 * Location: $XDG_STATE_HOME/airlock/<workspace-id>/ (default
 * ~/.local/state/airlock/<id>/, directories mode 0700), where the id is the
 * first 16 bytes of SHA-256 over the realpath of the workspace directory,
 * in hex. One JSON file per producer, each written atomically (temporary
 * file, fsync, rename), mode 0600:
 *
 *   withheld.json  written by sync after every scan:
 *     { "version": 1, "workspace": "/abs/dir", "policy": "<source>",
 *       "time": "<UTC ISO 8601>",
 *       "withheld": [ { "path": "...", "rule": "secret: ..." }, ... ],
 *       "withheld_total": N, "withheld_omitted": M,
 *       "skipped":  [ { "path": "...", "reason": "special file ..." } ],
 *       "skipped_total": N, "skipped_omitted": M }
 *   failed.json    written by airlock up when the set of paths the guest
 *     could not apply changes (sync_failures; doc/SYNC.md "Per-path
 *     failures"): { "version": 1, "workspace", "time",
 *       "not_in_guest": [ { "path", "errno", "error", "message",
 *       "attempts", "since_ms" } ], "not_in_guest_total": N,
 *       "not_in_guest_omitted": M }; an empty list once all applied.
 *   egress.json    reserved for the egress proxy's denial log (same
 *     conventions: { "version": 1, "denials": [ {...} ], "denials_total",
 *     "denials_omitted" }); `airlock audit` prints it when present.
 *
 * Lists are capped (SYNC_RECORDS_MAX entries are written; the totals say
 * how many there were), so memory and file size stay bounded.
 *
 * Errors are -errno; err names the file.
 */

#include <stddef.h>
#include <stdint.h>

#include "airlock/sync/sync.h"

#define AUDIT_WITHHELD_FILE "withheld.json"
#define AUDIT_EGRESS_FILE   "egress.json"
#define AUDIT_FAILED_FILE   "failed.json"
#define AUDIT_FILE_MAX	    (64u << 20) /* larger audit files are refused when read */

/* The workspace id of dir (32 hex chars + NUL). */
int audit_workspace_id(const char *dir, char id[33]);

/* The audit directory of dir (created with mode 0700 when create != 0). */
int audit_dir(const char *dir, int create, char *out, size_t outlen, char *err, size_t errlen);

/* Write withheld.json for workspace dir. 0 or -errno with err set: a full
 * or read-only state directory gives its own errno (ENOSPC, EROFS), never a
 * bare EIO. */
int audit_save_withheld(const char *dir, const char *policy_source, const struct sync_record *withheld, size_t nw,
			uint64_t withheld_total, const struct sync_record *skipped, size_t ns, uint64_t skipped_total,
			char *err, size_t errlen);

/* Write a JSON document to audit directory file `name` atomically; takes
 * a jansson json_t* (void * here so this header does not need jansson). */
int audit_write_json(const char *dir, const char *name, void *json, char *err, size_t errlen);

/* Read one audit file of workspace dir; *json gets a json_t* (caller
 * json_decref's), or NULL with 0 returned when the file does not exist. */
int audit_read_json(const char *dir, const char *name, void **json, char *err, size_t errlen);

#endif
