/*
 * The lease timings meta and its clients both build on (docs/architecture.md,
 * "The lookup cache and its leases"): meta grants and revokes by them
 * (src/meta/leases.h), a client's lookup cache trusts its copies by them
 * (src/client/lcache.c). They are a contract between the two sides, so they live
 * below both.
 */
#ifndef STK_COMMON_LEASE_H
#define STK_COMMON_LEASE_H

#define STK_LEASE_GRANT_MS 30000u /* how long a lease lasts without a change */
#define STK_LEASE_VALID_MS 2000u  /* a client's trust after its last answered watch */

#endif
