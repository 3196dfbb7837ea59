/**
 * Ids of a prepared prompt file: the source's id, else the content hash generation gives a
 * prompt without one; made unique within the file, since the prompt file reader refuses a
 * repeated id.
 */
import { contentSampleId, type ChatMessage } from '../../shared/index.js';
import { Hash64Set, idHash } from './prompt-hash.js';

/** The id a prompt gets before it is made unique: its own, else `h:` + its content hash (with its tools, when it has some). */
export function promptId(
  sourceId: string | undefined,
  messages: readonly ChatMessage[],
  tools?: readonly unknown[],
): string {
  return sourceId !== undefined && sourceId.trim() !== '' ? sourceId : contentSampleId(messages, tools);
}

/**
 * Hands out unique ids: the first prompt with an id keeps it; a later prompt with the same id
 * and other messages gets `<id>~2` (`~3`, …), in the order prompts are kept.
 */
export class UniqueIds {
  private readonly used = new Hash64Set();

  /** The id `id` becomes, and whether it had to change. */
  assign(id: string): { id: string; renamed: boolean } {
    if (this.used.add(idHash(id))) return { id, renamed: false };
    for (let n = 2; ; n += 1) {
      const candidate = `${id}~${n}`;
      if (this.used.add(idHash(candidate))) return { id: candidate, renamed: true };
    }
  }

  /** Bytes the remembered ids take. */
  get bytes(): number {
    return this.used.bytes;
  }
}
