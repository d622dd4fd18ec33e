import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

const IV_BYTES = 12;
const TAG_BYTES = 16;

function seal(key: Buffer, plaintext: Buffer, aad: string): Buffer {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(Buffer.from(aad));
  const body = Buffer.concat([cipher.update(plaintext), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), body]);
}

function open(key: Buffer, sealed: Uint8Array, aad: string): Buffer {
  const buf = Buffer.from(sealed);
  const iv = buf.subarray(0, IV_BYTES);
  const tag = buf.subarray(IV_BYTES, IV_BYTES + TAG_BYTES);
  const decipher = createDecipheriv('aes-256-gcm', key, iv);
  decipher.setAAD(Buffer.from(aad));
  decipher.setAuthTag(tag);
  return Buffer.concat([decipher.update(buf.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]);
}

/**
 * Envelope encryption of tenant secrets: each account has a random 256-bit data key, stored
 * only wrapped (AES-256-GCM) under the instance master key. Secret values are AES-256-GCM
 * under the data key, with the account id and a purpose label as associated data, so a
 * ciphertext copied to another account or another column does not decrypt. Deleting the
 * account row deletes its wrapped key, after which its ciphertexts cannot be read.
 */
export class Keyring {
  readonly #master: Buffer;

  constructor(masterKey: Buffer) {
    if (masterKey.length !== 32) throw new Error('master key must be 32 bytes');
    this.#master = masterKey;
  }

  /** A fresh data key for a new account, already wrapped for storage. */
  newWrappedDataKey(accountId: string): Buffer {
    return seal(this.#master, randomBytes(32), `dk:${accountId}`);
  }

  encrypt(accountId: string, wrappedDataKey: Uint8Array, purpose: string, plaintext: string): Buffer {
    const dataKey = open(this.#master, wrappedDataKey, `dk:${accountId}`);
    return seal(dataKey, Buffer.from(plaintext, 'utf8'), `${purpose}:${accountId}`);
  }

  decrypt(accountId: string, wrappedDataKey: Uint8Array, purpose: string, sealed: Uint8Array): string {
    const dataKey = open(this.#master, wrappedDataKey, `dk:${accountId}`);
    return open(dataKey, sealed, `${purpose}:${accountId}`).toString('utf8');
  }
}

/** Parses MASTER_KEY (64 hex digits or base64 of 32 bytes). */
export function parseMasterKey(text: string): Buffer {
  const trimmed = text.trim();
  const key = /^[0-9a-fA-F]{64}$/.test(trimmed) ? Buffer.from(trimmed, 'hex') : Buffer.from(trimmed, 'base64');
  if (key.length !== 32) throw new Error('MASTER_KEY must be 32 bytes as 64 hex digits or base64');
  return key;
}
