// The UI is built into a folder the C++ build names (--outDir) and embedded in
// the serval binary (scripts/embed.mjs); nothing is loaded from another origin.
import { defineConfig } from 'vite';

// `npx vite` (development): the API calls go to a running serval serve.
const api = process.env.SERVAL_API || 'http://127.0.0.1:8080';

export default defineConfig({
  base: '/',
  server: { proxy: { '/v1': api, '/health': api } },
  build: {
    target: 'es2022',
    assetsInlineLimit: 0,      // no data: URLs for assets: every file is served by serval
    modulePreload: { polyfill: false },  // the polyfill is an inline script, which the CSP forbids
    reportCompressedSize: false,
    chunkSizeWarningLimit: 800,
  },
});
