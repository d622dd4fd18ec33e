/*
 * The shapes a secret binding can take, and how a bound value becomes the header the runner's
 * proxy writes (DECISIONS "Sandboxes that hold"). The service lists the presets
 * (`GET /api/secret-bindings/presets`); the runner renders the header with `bindingHeader`, so
 * both sides read one table.
 */

/** The placeholder a binding's `format` holds exactly once: where the secret's value goes. */
export const BINDING_VALUE_SLOT = '{value}';

export interface BindingPreset {
  name: string;
  /** The request header the value is written into (lower case). */
  header: string;
  /** The header's value, `{value}` standing for the secret (see `bindingHeader` for `basic`). */
  format: string;
  /** The hosts the preset is meant for; empty: any host. A binding names its own host all the same. */
  hosts: readonly string[];
}

/**
 * The presets by name. `basic` takes a value of the form `user:password`, which is base64-encoded
 * before it fills `{value}` (HTTP Basic authentication); every other shape writes the value as it
 * is.
 */
export const SECRET_BINDING_PRESETS = {
  bearer: { name: 'bearer', header: 'authorization', format: 'Bearer {value}', hosts: [] },
  basic: { name: 'basic', header: 'authorization', format: 'Basic {value}', hosts: [] },
  'x-api-key': { name: 'x-api-key', header: 'x-api-key', format: '{value}', hosts: [] },
  github: { name: 'github', header: 'authorization', format: 'token {value}', hosts: ['api.github.com', 'github.com'] },
} as const satisfies Record<string, BindingPreset>;

export type BindingPresetName = keyof typeof SECRET_BINDING_PRESETS;

export const SECRET_BINDING_PRESET_NAMES = Object.keys(SECRET_BINDING_PRESETS) as [
  BindingPresetName,
  ...BindingPresetName[],
];

/** The presets in the order they are listed. */
export const SECRET_BINDING_PRESET_LIST = SECRET_BINDING_PRESET_NAMES.map((name) => SECRET_BINDING_PRESETS[name]);

/** A binding's shape: a preset's name, or a header and a format of one's own. */
export type BindingShape = BindingPresetName | { header: string; format: string };

/**
 * The header a request to the bound host carries for `value`: the shape's header name, and its
 * format with `{value}` replaced (by the base64 of `value` for the `basic` preset). Pure; the
 * value is neither checked nor logged.
 */
export function bindingHeader(shape: BindingShape, value: string): { name: string; value: string } {
  const { header, format } = typeof shape === 'string' ? SECRET_BINDING_PRESETS[shape] : shape;
  const filled = shape === 'basic' ? Buffer.from(value, 'utf8').toString('base64') : value;
  // A function replacement: `$&` and friends in the value are not patterns.
  return { name: header.toLowerCase(), value: format.replace(BINDING_VALUE_SLOT, () => filled) };
}
