// The origin's storage quota: how much more the store may keep, asked before a download and its first chunk.

import { StoreError, formatBytes } from "./errors.js";

const QUOTA_MARGIN = 64 << 20;         // keep this much free: IndexedDB needs room for its own bookkeeping

export async function storageEstimate() {
  const storage = navigator.storage;
  if (!storage?.estimate) return { usage: null, quota: null, persisted: false };
  const { usage, quota } = await storage.estimate();
  const persisted = storage.persisted ? await storage.persisted() : false;
  return { usage, quota, persisted };
}

// Asks the browser not to evict the store under storage pressure; true when granted.
export async function requestPersist() {
  return navigator.storage?.persist ? navigator.storage.persist() : false;
}

// Throws a QuotaError naming the space needed when `bytes` more would not fit the origin's quota.
export async function checkQuota(bytes, name = "the model") {
  const { usage, quota } = await storageEstimate();
  if (quota == null || bytes <= 0) return;
  const free = quota - usage;
  if (bytes + QUOTA_MARGIN > free) {
    throw new StoreError("QuotaError",
      `${name} needs ${formatBytes(bytes)} more storage, but this browser allows this site only ${formatBytes(Math.max(0, free))} more`,
      `delete stored models or free ${formatBytes(bytes + QUOTA_MARGIN - free)} of disk space, then try again`);
  }
}
