// Store errors: a name the UI can switch on, a message saying what happened, a hint saying what to do.
// They cross postMessage and IndexedDB as plain {name, message, hint} (see errorRecord).

export class StoreError extends Error {
  constructor(name, message, hint = null) {
    super(message);
    this.name = name;
    this.hint = hint;
  }
}

// Failures worth retrying as they are (a dropped connection, a short body); everything else is final.
export const RETRYABLE = new Set(["NetworkError", "ShortReadError", "ServerError"]);

export const errorRecord = (err) => ({ name: err?.name ?? "Error", message: String(err?.message ?? err), hint: err?.hint ?? null });

export function formatBytes(n) {
  if (n == null) return "?";
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(n >= 1e8 ? 0 : 1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(0)} kB`;
  return `${n} bytes`;
}
