/** Telling JSON values apart once parsed. */

/** Whether `value` is a JSON object (a plain mapping): not null, not an array. */
export function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}
