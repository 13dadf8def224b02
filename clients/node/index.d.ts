// Type declarations of @keyshard/client (hand-written).
//
// Conventions: durations are seconds (numbers) in and out; 64-bit numbers
// of the API (epoch, token, revision, version, seq, position) are BigInt in
// answers and accepted as BigInt, safe integers or decimal strings in
// requests. Client.call() returns the raw JSON answer (64-bit numbers as
// strings, durations as "Ns" strings).

import { EventEmitter } from 'node:events';

// --- hashing ------------------------------------------------------------------

export type HashMode = 'xxh64' | 'synapse-sha256';
export declare const HASH_MODES: readonly HashMode[];
export declare const MAX_BUCKETS: 65536;
/** The key's bucket in [0, buckets): xxh64 is (xxh64(utf8(key)) * buckets) >> 64. */
export declare function bucket(key: string | Uint8Array, buckets: number, hash?: HashMode): number;
/** A key → bucket function for a fixed bucket count and hash mode (arguments checked once). */
export declare function hasher(buckets: number, hash?: HashMode): (key: string | Uint8Array) => number;
/** xxh64(key, seed 0). */
export declare function xxh64(key: string | Uint8Array): bigint;

// --- errors -------------------------------------------------------------------

export type ErrorCode =
  | 'canceled' | 'unknown' | 'invalid_argument' | 'deadline_exceeded' | 'not_found' | 'already_exists'
  | 'permission_denied' | 'resource_exhausted' | 'failed_precondition' | 'aborted' | 'out_of_range'
  | 'unimplemented' | 'internal' | 'unavailable' | 'data_loss' | 'unauthenticated' | 'not_granted';

export interface ErrorDetail { type: string; value: string; debug?: unknown }

export declare class KeyshardError extends Error {
  constructor(code: ErrorCode | string, message: string, details?: ErrorDetail[], options?: ErrorOptions);
  readonly code: ErrorCode | string;
  details: ErrorDetail[];
}
declare class CodedError extends KeyshardError {
  constructor(message: string, details?: ErrorDetail[], options?: ErrorOptions);
}
export declare class Canceled extends CodedError {}
export declare class Unknown extends CodedError {}
export declare class InvalidArgument extends CodedError {}
export declare class DeadlineExceeded extends CodedError {}
export declare class NotFound extends CodedError {}
export declare class AlreadyExists extends CodedError {}
export declare class PermissionDenied extends CodedError {}
export declare class ResourceExhausted extends CodedError {}
export declare class FailedPrecondition extends CodedError {}
export declare class Aborted extends CodedError {}
export declare class OutOfRange extends CodedError {}
export declare class Unimplemented extends CodedError {}
export declare class Internal extends CodedError {}
export declare class Unavailable extends CodedError {}
export declare class DataLoss extends CodedError {}
export declare class Unauthenticated extends CodedError {}
/** Client-side only: the map gives the bucket to this worker but its grant is not there (yet), or it is fencing. */
export declare class NotGranted extends KeyshardError { constructor(message: string) }
/** The Client, Router, Worker or HotKeys was closed. */
export declare class Closed extends KeyshardError { constructor(message?: string) }

export declare const WRONG_OWNER_TYPE: 'keyshard.v1.WrongOwner';
export interface WrongOwnerFields { bucket: number; owner: string; address: string; epoch: bigint }
/** The key's bucket belongs to `owner` at `address`: retry there once your map reaches `epoch`. owner is "" if unassigned. */
export declare class WrongOwner extends FailedPrecondition implements WrongOwnerFields {
  constructor(bucket: number, owner?: string, address?: string, epoch?: bigint | number, message?: string);
  readonly bucket: number;
  readonly owner: string;
  readonly address: string;
  readonly epoch: bigint;
  /** The Connect JSON error body to answer a misrouted request with (HTTP 400). */
  toConnectError(): { code: 'failed_precondition'; message: string; details: { type: string; value: string }[] };
}
export declare function decodeWrongOwner(bytes: Uint8Array | string): WrongOwnerFields;
export declare function encodeWrongOwner(o: Partial<WrongOwnerFields>): Uint8Array;
export declare function fromAnswer(status: number, text: string, url: string): KeyshardError;
export declare function errorClassOf(code: string): (new (message: string, details?: ErrorDetail[]) => KeyshardError) | undefined;

// --- client -------------------------------------------------------------------

export type U64 = bigint | number | string;
export type KeyspaceMode = 'exclusive' | 'stream' | 'KEYSPACE_MODE_UNSPECIFIED' | 'KEYSPACE_MODE_EXCLUSIVE' | 'KEYSPACE_MODE_STREAM';

export interface CallOptions {
  /** Seconds for the whole call over every replica (default: the client's timeout + wait). */
  timeout?: number;
  /** Seconds of a long poll's wait: added to the call's and to each attempt's time limit. */
  wait?: number;
  signal?: AbortSignal;
}
export interface ClientOptions {
  token?: string;
  /** Seconds per call, over every replica. Default 10. */
  timeout?: number;
  /** Seconds per attempt at one replica when there are several. Default 5. */
  replicaTimeout?: number;
}
export interface KeyspaceSpec {
  name: string;
  buckets?: number;
  hash?: HashMode | '';
  mode?: KeyspaceMode;
  leaseTtl?: number;
  drainTimeout?: number;
}
export interface Keyspace {
  name: string;
  buckets: number;
  hash: HashMode;
  mode: 'KEYSPACE_MODE_UNSPECIFIED' | 'KEYSPACE_MODE_EXCLUSIVE' | 'KEYSPACE_MODE_STREAM';
  leaseTtl: number;
  drainTimeout: number;
}
export interface Member {
  id: string;
  address: string;
  weight: number;
  zone: string;
  metadata: Record<string, string>;
}
export interface MemberSpec {
  id: string;
  address?: string;
  weight?: number;
  zone?: string;
  metadata?: Record<string, string>;
}
export interface KeyspaceMap {
  keyspace: string;
  epoch: bigint;
  buckets: number;
  hash: HashMode;
  members: Member[];
  /** One entry per bucket: 0 unassigned, i = members[i-1]. */
  owners: number[];
}
export interface HotKeyPoolSpec {
  name: string;
  threshold: number;
  lowThreshold?: number;
  cooldown?: number;
  reportThreshold?: number;
  reportMaxAge?: number;
  maxKeys?: number;
}
export interface HotKeyPool extends Required<HotKeyPoolSpec> {}
export interface OverflowKey { key: string; rate: number; since: Date | null; coolingSince: Date | null }
export interface OverflowSet { pool: string; version: bigint; keys: OverflowKey[] }

export declare const LONG_POLL_MARGIN: number;

export declare class Client {
  /** url: one replica, several comma-separated, or an array. */
  constructor(url: string | string[], options?: ClientOptions);
  readonly urls: string[];
  readonly timeout: number;
  readonly replicaTimeout: number;
  readonly closed: boolean;
  close(): Promise<void>;
  /** A raw call: POST <url>/keyshard.v1.<service>/<method>; resolves with the answer's JSON as sent. */
  call(service: string, method: string, body?: object, options?: CallOptions): Promise<any>;

  createKeyspace(keyspace: KeyspaceSpec, options?: CallOptions): Promise<Keyspace>;
  getKeyspace(name: string, options?: CallOptions): Promise<Keyspace>;
  listKeyspaces(options?: CallOptions): Promise<Keyspace[]>;
  updateKeyspace(keyspace: { name: string; leaseTtl?: number; drainTimeout?: number }, options?: CallOptions): Promise<Keyspace>;
  listMembers(keyspace: string, options?: CallOptions): Promise<{
    members: { member: Member; targetBuckets: number; grantedBuckets: number; releasingBuckets: number; draining: boolean }[];
    epoch: bigint;
  }>;
  drainMember(keyspace: string, member: string, options?: CallOptions): Promise<void>;
  status(options?: CallOptions): Promise<{
    replica: string;
    leader: string;
    keyspaces: {
      keyspace: Keyspace; epoch: bigint; members: number; unassignedBuckets: number; handoffsInFlight: number; drainingMembers: number; releasingBuckets: number;
      /** Active members (kept alive once, not draining) the current map gives no bucket: with buckets enough, a map not written yet (a join held back by the rebalance gap). */
      membersWithoutBuckets: number;
    }[];
    replicas: { id: string; url: string; leader: boolean }[];
    store: { healthy: boolean; error: string; endpoints: string[]; dbSizeBytes: bigint; revision: bigint; latency: number };
  }>;
  /** The latest epochs of the keyspace's map, newest first (limit 0: 50, at most 500). */
  history(keyspace: string, options?: CallOptions & { limit?: number }): Promise<{
    epoch: bigint; time: Date | null;
    reason: 'create' | 'join' | 'leave' | 'crash' | 'drain' | 'load' | 'update' | 'import' | 'unspecified';
    members: string[]; movedBuckets: number; moves: { from: string; to: string; buckets: number }[]; detail: string;
  }[]>;
  /** Every bucket in runs of alike buckets; owner and holder are member ids ('' none). */
  buckets(keyspace: string, options?: CallOptions): Promise<{
    epoch: bigint; buckets: number; stream: boolean;
    runs: { first: number; count: number; owner: string; holder: string; token: bigint; state: 'unassigned' | 'granted' | 'releasing' | 'awaiting-grant'; position: bigint }[];
  }>;
  putHotKeyPool(pool: HotKeyPoolSpec, options?: CallOptions): Promise<HotKeyPool>;
  listHotKeyPools(options?: CallOptions): Promise<HotKeyPool[]>;
  getPositions(keyspace: string, options?: CallOptions & { behind?: number }): Promise<{
    min: bigint; max: bigint; spread: bigint;
    runs: { first: number; count: number; position: bigint }[];
    behind: { bucket: number; position: bigint; member: string; token: bigint }[];
    epoch: bigint; revision: bigint;
  }>;
  getMap(keyspace: string, options?: CallOptions & { sinceEpoch?: U64; wait?: number }): Promise<{ map: KeyspaceMap; changed: boolean }>;
  lookup(keyspace: string, keys: string[], options?: CallOptions): Promise<{ epoch: bigint; owners: { key: string; bucket: number; member: string; address: string }[] }>;
  reportHotKeys(pool: string, producer: string, keys: { key: string; rate: number }[], options?: CallOptions): Promise<{ pool: HotKeyPool; version: bigint }>;
  getOverflowSet(pool: string, options?: CallOptions & { sinceVersion?: U64; wait?: number }): Promise<{ set: OverflowSet; changed: boolean }>;
  putTenantPool(pool: { name: string; policy: object; leaseTtl?: number }, options?: CallOptions): Promise<any>;
  getPoolSnapshot(pool: string, options?: CallOptions & { sinceVersion?: U64; wait?: number }): Promise<{ snapshot: PoolSnapshot; changed: boolean }>;
  getTenants(pool: string, tenants?: string[], options?: CallOptions & { limit?: number }): Promise<{
    version: bigint;
    tenants: { assignment: TenantAssignment; rate: number; rateKnown: boolean; known: boolean }[];
    total: number;
  }>;
  /** options.period: the seconds the counts were counted over; omitted: placed at their arrival. */
  reportLoad(pool: string, reporter: string, seq: U64, counts: { tenant: string; count: U64 }[], options?: CallOptions & { period?: number }): Promise<{ outcome: string; version: bigint }>;
}

// --- router -------------------------------------------------------------------

export interface OwnerInfo { bucket: number; member: string; address: string; epoch: bigint }
export interface Staleness { since: Date; error: Error }

export declare class Router extends EventEmitter {
  constructor(client: Client, keyspace: string, options?: { wait?: number });
  readonly client: Client;
  readonly keyspace: string;
  /** Resolves with the first map; rejects on NotFound and the like. */
  start(): Promise<KeyspaceMap>;
  readonly map: KeyspaceMap | null;
  readonly epoch: bigint;
  /** null while fresh; since when and why while the control plane is unreachable (the last map is kept). */
  readonly stale: Staleness | null;
  bucket(key: string | Uint8Array): number;
  owner(key: string | Uint8Array): OwnerInfo;
  ownerOfBucket(bucket: number): OwnerInfo;
  addressOf(member: string): string | undefined;
  /** Resolves with the next map of a new epoch. */
  changed(): Promise<KeyspaceMap>;
  waitEpoch(epoch: U64, options?: { timeout?: number }): Promise<KeyspaceMap>;
  close(): Promise<void>;
  on(event: 'change', listener: (map: KeyspaceMap) => void): this;
  on(event: 'stale', listener: (s: Staleness) => void): this;
  on(event: 'recovered', listener: () => void): this;
  on(event: 'error', listener: (err: Error) => void): this;
}

// --- worker -------------------------------------------------------------------

export declare function fenceMargin(ttlMs: number, marginMs?: number): number;

export interface Clock { now(): number }

export declare class Lease {
  constructor(o: { ttl: number; margin: number; sent: number; clock?: Clock });
  readonly ttl: number;
  readonly margin: number;
  /** ms on the clock: send time of the newest acknowledged keep-alive + TTL − margin. */
  readonly deadline: number;
  readonly acked: boolean;
  valid(): boolean;
  renewed(sent: number, ttlLeft?: number): boolean;
  end(): void;
}

export declare class Grant {
  constructor(g: { bucket: number; token: bigint; from?: bigint }, session: string, lease: Lease, ac: AbortController);
  readonly bucket: number;
  /** Fencing token: strictly increases per bucket. Pass it to storage. */
  readonly token: bigint;
  /** Stream keyspaces: where to start reading the bucket's events. */
  readonly from: bigint;
  readonly session: string;
  /** Aborted when the grant ends: a fence, a loss, or after its release. */
  readonly signal: AbortSignal;
  /** Call right before each write: false once the fence deadline passed (by the clock, now) or the grant ended. */
  valid(): boolean;
  readonly deadline: number;
  toJSON(): { bucket: number; token: string; from: string };
}

export interface Handler {
  /** Called when the bucket is granted. Never concurrently with another call for the same bucket. */
  acquire(grant: Grant): void | Promise<void>;
  /** Called when the grant ends; for a handoff, finish in-flight work and resolve: the Release RPC follows. */
  release(bucket: number, grant: Grant): void | Promise<void>;
  /**
   * Stream keyspaces, optional: after release() of a bucket asked back, its
   * final position (the next event not handled); the Release call carries
   * it. undefined: the grant's from.
   */
  finalPosition?(bucket: number, grant: Grant): bigint | number | undefined | null;
}

export interface BucketPosition { bucket: number; token: U64; position: U64 }

export interface WorkerOptions extends MemberSpec {
  /** Take over the id from a live session (a restarted process). */
  replace?: boolean;
  /** Seconds; default max(TTL/10, 0.5), at most TTL/2. */
  fenceMargin?: number;
  /** A monotonic clock in ms (default performance.now). */
  clock?: Clock;
  /** Where the worker logs (default: nowhere; events say everything). */
  logger?: { debug(msg: string): void; info(msg: string): void; warn(msg: string): void; error(msg: string): void };
}

export interface SessionEvent { session: string }
export interface SessionErrorEvent { session: string; error: Error }

export declare class Worker extends EventEmitter {
  constructor(client: Client, keyspace: string, member: WorkerOptions, handler: Handler);
  readonly client: Client;
  readonly keyspace: string;
  readonly router: Router;
  /** Resolves with the session once joined; rejects if the worker cannot join (NotFound, AlreadyExists, ...). */
  start(): Promise<string>;
  /** Resolves once the worker stopped after close(); rejects with the error that stopped it by itself. */
  readonly done: Promise<void>;
  readonly session: string | null;
  held(): Grant[];
  /** Every grant of the current session not released, acquired or not (stream commits: maxToken = the highest token). */
  granted(): { session: string | null; grants: Grant[] };
  /** Stream keyspaces: record the positions (one Commit). Buckets handed off with a final position are added as exceptions. */
  commit(c: { session?: string | null; maxToken: U64; position: U64; exceptions?: BucketPosition[] }): Promise<{ revision: bigint }>;
  /** The grant of key's bucket; throws WrongOwner (another member's) or NotGranted. */
  owns(key: string | Uint8Array): Grant;
  /** Resolves with the grant once held; rejects with WrongOwner when waiting would not help, DeadlineExceeded, or Closed. */
  waitGrant(key: string | Uint8Array, options?: { timeout?: number; signal?: AbortSignal }): Promise<Grant>;
  bucket(key: string | Uint8Array): number;
  /** Drain (hand every bucket over), then leave. Past timeout seconds: stop at once, reject with DeadlineExceeded. */
  close(options?: { timeout?: number }): Promise<void>;
  on(event: 'joined' | 'rejoined' | 'left', listener: (e: SessionEvent) => void): this;
  on(event: 'fenced' | 'session-lost', listener: (e: SessionErrorEvent) => void): this;
  on(event: 'acquired' | 'released', listener: (g: Grant) => void): this;
  on(event: 'renewed', listener: (e: { session: string; deadline: number }) => void): this;
  on(event: 'error', listener: (err: Error) => void): this;
}

// --- hot keys -----------------------------------------------------------------

export declare const MAX_REPORT_KEYS: 1024;
export declare const MAX_REPORT_KEY_BYTES: 512;

export interface KeyRate { key: string; rate: number }

export declare class Detector {
  constructor(options?: { capacity?: number; halfLife?: number; clock?: Clock });
  readonly capacity: number;
  readonly halfLife: number;
  readonly size: number;
  observe(key: string, n?: number, now?: number): void;
  rate(key: string, now?: number): number;
  top(minRate?: number, limit?: number, now?: number): (KeyRate & { lower: number })[];
}

export interface HotKeysOptions {
  pool: string;
  producer: string;
  report: Detector | ((minRate: number) => KeyRate[]);
  /** Seconds between reports; default 1. */
  interval?: number;
  onSet?: (keys: ReadonlySet<string>, version: bigint) => void;
  /** Seconds per GetOverflowSet long poll; default 30. */
  wait?: number;
}

export declare class HotKeys extends EventEmitter {
  constructor(client: Client, options: HotKeysOptions);
  readonly pool: string;
  readonly producer: string;
  readonly version: bigint;
  readonly reportThreshold: number;
  readonly stale: Staleness | null;
  readonly stats: { reports: number; reportFailures: number; keysReported: number; lastError: Error | null };
  start(): Promise<OverflowSet>;
  isHot(key: string): boolean;
  readonly set: ReadonlySet<string>;
  readonly keys: OverflowKey[];
  reportNow(): Promise<void>;
  close(): Promise<void>;
  on(event: 'change', listener: (e: { version: bigint; keys: ReadonlySet<string> }) => void): this;
  on(event: 'stale', listener: (s: Staleness) => void): this;
  on(event: 'recovered', listener: () => void): this;
  on(event: 'error', listener: (err: Error) => void): this;
}

// --- tenant pools -------------------------------------------------------------

export interface TenantAssignment {
  tenant: string;
  size?: number;
  members?: { member: string; added?: string; ready?: boolean }[];
  removed?: { member: string; at?: string }[];
  targets?: { from?: string; members?: string[] }[];
  why?: string;
  when?: string;
}
export interface PoolSnapshot {
  pool?: string;
  version: bigint;
  policy?: object;
  members: Member[];
  tenants: TenantAssignment[];
  [k: string]: unknown;
}

export declare class PoolFollower extends EventEmitter {
  constructor(client: Client, pool: string, options?: { wait?: number });
  readonly pool: string;
  readonly version: bigint;
  readonly snapshot: PoolSnapshot | null;
  readonly stale: Staleness | null;
  readonly members: Member[];
  start(): Promise<PoolSnapshot>;
  known(tenant: string): boolean;
  targets(tenant: string, now?: number): Promise<string[]>;
  targetsSync(tenant: string, now?: number): string[] | null;
  serves(member: string, tenant: string): Promise<boolean>;
  close(): Promise<void>;
}

export declare class LoadReporter extends EventEmitter {
  constructor(client: Client, pool: string, reporter: string, options?: { interval?: number });
  readonly stats: { reports: number; failures: number; dropped: number };
  add(tenant: string, n?: number): void;
  flush(): Promise<void>;
  close(): Promise<void>;
}
