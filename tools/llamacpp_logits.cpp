// llamacpp_logits: run llama.cpp's own runtime on a GGUF and dump the logits of every position.
//
//   llamacpp_logits MODEL.gguf OUT.f32 TOKEN [TOKEN ...]
//   LLAMACPP_GREEDY=N llamacpp_logits MODEL.gguf OUT.f32 TOKEN [TOKEN ...]
//
// Decodes the tokens as ONE batch (positions 0..T-1, sequence 0) with an output requested on every
// row, then writes the logits as raw little-endian float32, row-major [T, n_vocab], to OUT.f32.
// With LLAMACPP_GREEDY=N it then decodes N more tokens greedily, one llama_decode per token (argmax of
// the last row, ties to the lowest id as NumPy's argmax), and prints them on a second stdout line.
// Chosen to make llama.cpp as close to an exact F32 reference as it allows:
//   - K and V cache in F32 (the default is F16, which would round every cached key/value);
//   - flash attention off (the plain KQ -> softmax -> KQV path);
//   - MTP layers not loaded (only the trunk logits are compared);
//   - no extra weight buffer types (AMX / repacked weights), only the plain ggml-cpu kernels;
//   - embeddings off, one thread (reproducible reductions), CPU only.
// Built by tools/compare_llamacpp_logits.py against a static CMake build of the same tree.
// Written against include/llama.h of llama_cpp_python 0.3.36's vendored llama.cpp.

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

static bool verbose = false;  // LLAMACPP_LOGITS_VERBOSE=1 keeps llama.cpp's full log

static void quiet_log(ggml_log_level level, const char * text, void *) {
    if (verbose || level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);  // keep errors, drop the chatter
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 TOKEN [TOKEN ...]\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> tokens;
    for (int i = 3; i < argc; i++) tokens.push_back((llama_token) atoi(argv[i]));
    const int32_t n = (int32_t) tokens.size();

    verbose = getenv("LLAMACPP_LOGITS_VERBOSE") != nullptr;
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mtp = false;         // trunk only
    mp.use_extra_bufts = false;  // no AMX/repacked weight buffers: the AMX path of this build
                                 // segfaults on quantized matmuls, and plain ggml kernels are the reference
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", argv[1]); return 1; }

    llama_context_params cp = llama_context_default_params();
    const int n_more = getenv("LLAMACPP_GREEDY") ? atoi(getenv("LLAMACPP_GREEDY")) : 0;
    cp.n_ctx = (uint32_t) (n + n_more < 64 ? 64 : n + n_more);  // small; attention is causal, padding is masked
    cp.n_batch = cp.n_ubatch = (uint32_t) n;   // the whole prompt in one ubatch
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.embeddings = false;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int32_t i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;  // output logits for every position
    }
    batch.n_tokens = n;
    if (int rc = llama_decode(ctx, batch)) { fprintf(stderr, "llama_decode failed: %d\n", rc); return 1; }

    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", argv[2]); return 1; }
    for (int32_t i = 0; i < n; i++) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (!row || fwrite(row, sizeof(float), (size_t) n_vocab, f) != (size_t) n_vocab) {
            fprintf(stderr, "no logits for row %d\n", i);
            return 1;
        }
    }
    fclose(f);
    printf("%d %d\n", n, n_vocab);  // shape, read by the Python side

    const int n_greedy = getenv("LLAMACPP_GREEDY") ? atoi(getenv("LLAMACPP_GREEDY")) : 0;
    const float * last = llama_get_logits_ith(ctx, n - 1);
    for (int g = 0; g < n_greedy; g++) {
        llama_token best = 0;
        for (int32_t v = 1; v < n_vocab; v++) if (last[v] > last[best]) best = v;
        printf("%d%c", best, g + 1 < n_greedy ? ' ' : '\n');
        llama_batch one = llama_batch_get_one(&best, 1);
        if (int rc = llama_decode(ctx, one)) { fprintf(stderr, "llama_decode failed: %d\n", rc); return 1; }
        last = llama_get_logits_ith(ctx, -1);
    }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
