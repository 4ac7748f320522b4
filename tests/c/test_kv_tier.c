/* test_kv_tier.c - the KV tiers under the arena: a prefix evicted to host
 * RAM or disk comes back and generates exactly the uncached tokens; the
 * disk tier survives a restart and save/load; bad files are refused one by
 * one with the file and the reason while the rest loads; tiers keep
 * salts, models and KV modes apart; budgets and the spill policy hold.
 * Synchronous stepping on the tiny synthetic model, then stories260K. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "ref_cases.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

enum { N_PROMPTS = 4, PROMPT = 48, GEN = 6 };

static char model_path[128], other_path[128];
static int32_t prompts[N_PROMPTS][PROMPT], expect[N_PROMPTS][GEN];

static tl_generate_params params(int no_cache, uint64_t salt) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = GEN;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    gp.salt = salt;
    return gp;
}

/* 16 blocks of 16 positions x 2 layers: one 48-token prompt and its
 * completion take 8, so the third prompt evicts the first. */
static tl_model *open_with(const char *path, const char *dir, size_t host, const char *mode) {
    tl_model_params mp = tl_model_default_params();
    mp.kv_mode = mode ? mode : "f16";
    mp.kv_mem = 16 * (2 * 2 * 16 * 16 * 2);
    if (mode && !strcmp(mode, "q8")) mp.kv_mem = 16 * 4096; /* any size: only the files matter */
    mp.kv_dir = dir;
    mp.kv_host_mem = host;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    return m;
}

static int gen(tl_model *m, int i, uint64_t salt, int32_t *out) {
    return tl_generate(m, prompts[i], PROMPT, params(0, salt), out, GEN);
}

static tl_cache_stats stats(tl_model *m) {
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    return st;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tlkv") != NULL && e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static void file_at(const char *dir, int k, char *out, size_t cap) {
    DIR *d = opendir(dir);
    int n = 0;
    out[0] = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".tlkv") && e->d_name[0] != '.' && n++ == k) snprintf(out, cap, "%s/%s", dir, e->d_name);
    if (d) closedir(d);
}

static void rm_dir(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}

/* Prompts 0..3 in turn, then 0 again: the last must come from a tier. */
static void evict_and_return(tl_model *m, const char *what, int tier) {
    int32_t out[GEN];
    int ok = 1;
    for (int i = 0; i < N_PROMPTS; i++) ok &= gen(m, i, 0, out) == GEN && !memcmp(out, expect[i], sizeof out);
    tl_cache_stats a = stats(m);
    CHECK(ok && a.evictions > 0 && a.tier_spills[tier] > 0,
          "%s: four prompts through a 16-block arena evict, and the evicted blocks spill (%lld evictions, %lld spilled)",
          what, (long long)a.evictions, (long long)a.tier_spills[tier]);
    int n = gen(m, 0, 0, out);
    tl_cache_stats b = stats(m);
    CHECK(n == GEN && !memcmp(out, expect[0], sizeof out), "%s: the first prompt again gives the uncached tokens",
          what);
    CHECK(b.tier_hits[tier] > a.tier_hits[tier] && b.tier_restored_tokens >= 32 && b.hit_tokens > a.hit_tokens,
          "%s: its blocks came back up from the tier (%lld blocks, %lld tokens restored, hit tokens %lld -> %lld)",
          what, (long long)(b.tier_hits[tier] - a.tier_hits[tier]), (long long)b.tier_restored_tokens,
          (long long)a.hit_tokens, (long long)b.hit_tokens);
    CHECK(tl_sched_check_invariants(m, NULL, 0) == 0, "%s: KV refcounts and the tree hold (%s)", what,
          tl_last_error());
}

static void host_tier(void) {
    tl_model *m = open_with(model_path, NULL, 1 << 20, NULL);
    CHECK(m != NULL, "a model with a 1 MiB host tier opens (%s)", tl_last_error());
    if (!m) return;
    evict_and_return(m, "host tier", 0);
    tl_cache_stats st = stats(m);
    CHECK(st.tier_budget[0] == 1 << 20 && st.tier_bytes[0] <= st.tier_budget[0] && st.tier_blocks[1] == 0,
          "host tier: within its budget, nothing on disk (%lld of %lld bytes)", (long long)st.tier_bytes[0],
          (long long)st.tier_budget[0]);
    tl_model_close(m);

    /* three logical blocks of budget (2 layers x 2048 bytes each): the oldest are dropped */
    m = open_with(model_path, NULL, 3 * 2 * 2048, NULL);
    int32_t out[GEN];
    for (int i = 0; i < N_PROMPTS; i++) gen(m, i, 0, out);
    st = stats(m);
    CHECK(st.tier_bytes[0] <= 3 * 2 * 2048 && st.tier_blocks[0] <= 3 && st.tier_dropped[0] > 0,
          "a small host tier keeps its budget and drops its least recent blocks (%lld blocks, %lld dropped)",
          (long long)st.tier_blocks[0], (long long)st.tier_dropped[0]);
    tl_model_close(m);

    m = open_with(model_path, NULL, 1 << 20, NULL);
    CHECK(tl_model_set_spill_policy(m, 1000, 0) == TL_OK, "a spill policy is accepted");
    for (int i = 0; i < N_PROMPTS; i++) gen(m, i, 0, out);
    st = stats(m);
    CHECK(st.evictions > 0 && st.tier_spills[0] == 0,
          "with min_tokens 1000 evicted nodes are dropped, not spilled (%lld evictions)", (long long)st.evictions);
    CHECK(tl_model_set_spill_policy(m, -1, 0) == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "-1"),
          "a negative min_tokens is refused by value (%s)", tl_last_error());
    tl_model_close(m);
}

static void disk_tier_and_restart(const char *dir) {
    tl_model *m = open_with(model_path, dir, 0, NULL);
    CHECK(m != NULL, "a model with a disk tier opens (%s)", tl_last_error());
    if (!m) return;
    evict_and_return(m, "disk tier", 1);
    int files = count_files(dir);
    CHECK(files > 0, "the disk tier holds block files (%d)", files);
    tl_model_close(m);

    /* a restart: the first request is served from disk */
    m = open_with(model_path, dir, 0, NULL);
    int32_t out[GEN];
    int ok = 1;
    for (int i = 0; i < N_PROMPTS; i++) ok &= gen(m, i, 0, out) == GEN && !memcmp(out, expect[i], sizeof out);
    tl_cache_stats st = stats(m);
    CHECK(ok && st.tier_hits[1] > 0 && st.hit_tokens >= 32,
          "after a restart the prompts hit blocks on disk and give the uncached tokens (%lld from disk, %lld hit "
          "tokens)",
          (long long)st.tier_hits[1], (long long)st.hit_tokens);
    tl_model_close(m);

    /* another salt never reaches these blocks */
    m = open_with(model_path, dir, 0, NULL);
    ok = gen(m, 0, 77, out) == GEN && !memcmp(out, expect[0], sizeof out);
    st = stats(m);
    CHECK(ok && st.tier_hits[1] == 0 && st.hit_tokens == 0,
          "a salted tenant's request does not reach unsalted blocks on disk (%lld)", (long long)st.tier_hits[1]);
    tl_model_close(m);
}

static void save_load_and_refusals(const char *dir) {
    tl_model *m = open_with(model_path, NULL, 0, NULL);
    int32_t out[GEN];
    gen(m, 0, 0, out);
    int saved = tl_model_save_cache(m, dir);
    CHECK(saved >= 3, "save_cache writes the cached prefix's full blocks (%d)", saved);
    CHECK(tl_model_save_cache(m, dir) == 0, "saving again writes nothing new (content-addressed)");
    CHECK(tl_model_save_cache(m, "/tmp/elsewhere") == TL_ERR_INVALID_ARG && strstr(tl_last_error(), dir),
          "another directory is refused, naming the disk tier (%s)", tl_last_error());
    tl_model_close(m);

    char victim[512], trunc[512], cmd[1200];
    file_at(dir, 0, victim, sizeof victim);
    file_at(dir, 1, trunc, sizeof trunc);
    FILE *f = fopen(victim, "r+b");
    fseek(f, -5, SEEK_END);
    int c = fgetc(f);
    fseek(f, -5, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
    CHECK(truncate(trunc, 100) == 0, "a file is truncated for the test");
    snprintf(cmd, sizeof cmd, "printf 'junk' > '%s/junk.tlkv'", dir);
    CHECK(system(cmd) == 0, "a junk file is written");

    m = open_with(model_path, NULL, 0, NULL);
    tl_cache_load_report rep;
    int rc = tl_model_load_cache(m, dir, &rep);
    CHECK(rc == TL_OK && rep.files == saved + 1 && rep.refused == 3 && rep.loaded == saved - 2,
          "load_cache refuses the 3 bad files and loads the rest (%d files, %d loaded, %d refused)", rep.files,
          rep.loaded, rep.refused);
    CHECK(strstr(rep.why, victim) && strstr(rep.why, "checksum") && strstr(rep.why, trunc) &&
              strstr(rep.why, "junk.tlkv"),
          "each refusal names the file and the reason:\n%s", rep.why);
    int n = gen(m, 0, 0, out);
    tl_cache_stats st = stats(m);
    CHECK(n == GEN && !memcmp(out, expect[0], sizeof out),
          "with bad blocks refused the prompt still gives the uncached tokens (%lld refused at use)",
          (long long)st.tier_refused[1]);
    CHECK(tl_sched_check_invariants(m, NULL, 0) == 0, "invariants hold after a partial restore (%s)", tl_last_error());
    tl_model_close(m);

    /* another model and another KV mode see nothing they can use */
    m = open_with(other_path, dir, 0, NULL);
    CHECK(m != NULL, "another model opens on the same directory (%s)", tl_last_error());
    if (m) {
        tl_model_load_cache(m, NULL, &rep);
        CHECK(rep.loaded == 0 && rep.refused == rep.files && strstr(rep.why, "model"),
              "another model refuses every file as another model's (%d of %d, %d loaded):\n%s", rep.refused, rep.files, rep.loaded, rep.why);
        tl_model_close(m);
    }
    m = open_with(model_path, dir, 0, "q8");
    if (m) {
        tl_model_load_cache(m, NULL, &rep);
        CHECK(rep.loaded == 0 && strstr(rep.why, "q8"), "a q8 model refuses f16 blocks by KV mode (%.200s)",
              rep.why);
        tl_model_close(m);
    }
}

static void bad_options(void) {
    setenv("TINYLOOP_KV_HOST_MEM", "12Q", 1);
    tl_model *m = open_with(model_path, NULL, 0, NULL);
    CHECK(!m && strstr(tl_last_error(), "TINYLOOP_KV_HOST_MEM") && strstr(tl_last_error(), "12Q"),
          "a bad TINYLOOP_KV_HOST_MEM fails the open naming it and its value (%s)", tl_last_error());
    unsetenv("TINYLOOP_KV_HOST_MEM");
    m = open_with(model_path, "/proc/no/such/dir", 0, NULL);
    CHECK(!m && strstr(tl_last_error(), "/proc/no/such/dir"), "an unusable kv_dir fails naming it (%s)",
          tl_last_error());
}

/* A gemma3 model whose local layers (window 8) release their early blocks:
 * a spilled prefix keeps them absent, comes back from each tier and after
 * a restart, and generates exactly the uncached tokens. */
static void sliding_window(const char *dir) {
    tm_spec specs[TM_ARCH_CASES];
    const char *names[TM_ARCH_CASES];
    tm_arch_cases(specs, names);
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_kv_tier_gemma_%d.gguf", (int)getpid());
    tm_write(&specs[3], path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_mode = "f16";
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "the gemma3 test model opens (%s)", tl_last_error());
    if (!m) return;
    tl_model_info info;
    tl_model_get_info(m, &info);
    int32_t ref[N_PROMPTS][GEN], out[GEN];
    for (int i = 0; i < N_PROMPTS; i++) tl_generate(m, prompts[i], PROMPT, params(1, 0), ref[i], GEN);
    tl_model_close(m);
    /* room for one prompt and a bit: the next pushes it out */
    mp.kv_mem = (size_t)(PROMPT + GEN + 16) * info.kv_token_bytes * 3 / 2;
    for (int tier = 0; tier < 2; tier++) {
        mp.kv_host_mem = tier == 0 ? 1 << 22 : 0;
        mp.kv_dir = tier == 1 ? dir : NULL;
        tl_model_open(path, mp, &m);
        if (!m) break;
        int ok = 1;
        for (int i = 0; i < N_PROMPTS; i++) ok &= gen(m, i, 0, out) == GEN && !memcmp(out, ref[i], sizeof out);
        tl_cache_stats a = stats(m);
        ok &= gen(m, 0, 0, out) == GEN && !memcmp(out, ref[0], sizeof out);
        tl_cache_stats b = stats(m);
        CHECK(ok && a.tier_spills[tier] > 0 && b.tier_hits[tier] > a.tier_hits[tier] && b.hit_tokens > a.hit_tokens,
              "gemma3, window 8, %s tier: a prefix with released local blocks spills, comes back and gives the "
              "uncached tokens (%lld blocks back, hit tokens %lld -> %lld)",
              tier ? "disk" : "host", (long long)(b.tier_hits[tier] - a.tier_hits[tier]), (long long)a.hit_tokens,
              (long long)b.hit_tokens);
        if (tier == 0) {
            size_t full = (size_t)info.n_layer * (info.kv_bytes / (size_t)info.kv_blocks_total);
            CHECK(a.tier_spill_bytes[0] < a.tier_spills[0] * (int64_t)full,
                  "gemma3: released local layers are not stored (%lld bytes for %lld blocks of %zu)",
                  (long long)a.tier_spill_bytes[0], (long long)a.tier_spills[0], full);
        }
        CHECK(tl_sched_check_invariants(m, NULL, 0) == 0, "gemma3, %s tier: refcounts and the tree hold (%s)",
              tier ? "disk" : "host", tl_last_error());
        tl_model_close(m);
    }
    /* a restart on the disk tier */
    tl_model_open(path, mp, &m);
    if (m) {
        int ok = gen(m, 2, 0, out) == GEN && !memcmp(out, ref[2], sizeof out);
        tl_cache_stats st = stats(m);
        CHECK(ok && st.tier_hits[1] > 0 && st.hit_tokens > 0,
              "gemma3 after a restart: served from disk with the uncached tokens (%lld hit tokens)",
              (long long)st.hit_tokens);
        tl_model_close(m);
    }
    unlink(path);
}

/* Gemma 3 270M (when fetched): a 1,100-token prefix, past its 512-token
 * window, evicted (a tenant budget of one block) into each tier and
 * restored; and a restart. The prompt's next tokens equal uncached ones. */
static void real_gemma(const char *dir) {
    const char *path = ref_default_model();
    if (!path || getenv("TL_TEST_QUICK")) {
        printf("SKIP Gemma 3 270M tier tests: %s\n", path ? "TL_TEST_QUICK" : "the default model is not fetched");
        return;
    }
    enum { P = 1100, S = 20, G = 8 };
    tl_model_params mp = tl_model_default_params();
    mp.kv_mode = "f16";
    mp.max_seq_len = 2048;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "Gemma 3 270M opens (%s)", tl_last_error());
    if (!m) return;
    static int32_t pr[P + S];
    int32_t ref[G], out[G];
    ref_fill_tokens(pr, P + S, tl_model_n_vocab(m), 5);
    int nr = ref_generate(m, pr, P + S, G, 1, NULL, ref);
    tl_model_close(m);
    for (int tier = 0; tier < 3; tier++) { /* host, disk, disk after a restart */
        mp.kv_host_mem = tier == 0 ? (size_t)1 << 30 : 0;
        mp.kv_dir = tier ? dir : NULL;
        tl_model_open(path, mp, &m);
        if (!m) break;
        if (tier < 2) {
            ref_generate(m, pr, P, 1, 0, NULL, out); /* the prefix, cached */
            tl_model_set_tenant_budget(m, 0, 1);      /* pushed down a tier */
            tl_model_set_tenant_budget(m, 0, 0);
        }
        int t = tier == 2 ? 1 : tier;
        int n = ref_generate(m, pr, P + S, G, 0, NULL, out);
        tl_cache_stats st = stats(m);
        CHECK(nr == G && n == G && !memcmp(out, ref, sizeof ref) && st.tier_hits[t] >= P / 16 - 1 &&
                  st.hit_tokens >= P - 16,
              "Gemma 3 270M, %s: a %d-token prefix comes back (%lld blocks, %lld hit tokens) and the next %d "
              "tokens equal uncached",
              tier == 0 ? "host tier" : tier == 1 ? "disk tier" : "restart on the disk tier", P,
              (long long)st.tier_hits[t], (long long)st.hit_tokens, G);
        CHECK(tl_sched_check_invariants(m, NULL, 0) == 0, "Gemma 3 270M: refcounts and the tree hold (%s)",
              tl_last_error());
        if (tier == 1) tl_model_save_cache(m, NULL);
        tl_model_close(m);
    }
}

/* stories260K, a real model: the restored path equals the uncached one. */
static void real_model(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", test_shared_dir());
    if (access(path, R_OK)) return;
    tl_model_params mp = tl_model_default_params();
    mp.kv_mode = "f16";
    mp.kv_dir = dir;
    mp.kv_host_mem = 4 << 20;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "stories260K opens with both tiers (%s)", tl_last_error());
    if (!m) return;
    tl_model_info info;
    tl_model_get_info(m, &info);
    tl_model_close(m);
    /* an arena of 3 prompts' worth: the others push the first out */
    enum { P = 96, G = 24 }; /* within its 128-token context */
    mp.kv_mem = (size_t)3 * (P + G + 16) / 16 * info.kv_token_bytes * 16;
    tl_model_open(path, mp, &m);
    int32_t pr[6][P], ref[G], out[G];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < P; j++) pr[i][j] = 1 + (j * 37 + i * 101 + j * j) % (info.n_vocab - 1);
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = G;
    gp.no_cache = 1;
    int nr = tl_generate(m, pr[0], P, gp, ref, G);
    gp.no_cache = 0;
    for (int i = 0; i < 6; i++) tl_generate(m, pr[i], P, gp, out, G);
    tl_cache_stats a = stats(m);
    int n = tl_generate(m, pr[0], P, gp, out, G);
    tl_cache_stats b = stats(m);
    CHECK(nr > 0 && n == nr && !memcmp(out, ref, (size_t)n * sizeof *out) && b.tier_restored_tokens > a.tier_restored_tokens,
          "stories260K: a prompt restored from the tiers gives the uncached greedy tokens (%lld tokens restored; "
          "%lld evictions, %lld + %lld spilled, %d blocks)",
          (long long)(b.tier_restored_tokens - a.tier_restored_tokens), (long long)b.evictions,
          (long long)b.tier_spills[0], (long long)b.tier_spills[1], b.blocks_total);
    tl_model_close(m);
}

int main(void) {
    tm_spec s = tm_default_spec();
    snprintf(model_path, sizeof model_path, "/tmp/tl_kv_tier_%d.gguf", (int)getpid());
    snprintf(other_path, sizeof other_path, "/tmp/tl_kv_tier_other_%d.gguf", (int)getpid());
    tm_write(&s, model_path);
    s.seed += 1;
    tm_write(&s, other_path);
    unsetenv("TINYLOOP_KV_DIR");
    unsetenv("TINYLOOP_KV_DISK_MEM");
    unsetenv("TINYLOOP_KV_HOST_MEM");

    tl_model *m = open_with(model_path, NULL, 0, NULL);
    CHECK(m != NULL, "the model opens without tiers (%s)", tl_last_error());
    for (int i = 0; i < N_PROMPTS; i++) {
        for (int j = 0; j < PROMPT; j++) prompts[i][j] = 3 + (j * (7 + 2 * i) + 11 * i) % 300;
        tl_generate(m, prompts[i], PROMPT, params(1, 0), expect[i], GEN);
    }
    tl_cache_stats st = stats(m);
    CHECK(st.tier_budget[0] == 0 && st.tier_spills[0] == 0 && st.tier_spills[1] == 0,
          "without tiers nothing is spilled");
    tl_model_close(m);

    char d1[] = "/tmp/tl_kv_tier_XXXXXX", d2[] = "/tmp/tl_kv_tier_XXXXXX", d3[] = "/tmp/tl_kv_tier_XXXXXX";
    char d4[] = "/tmp/tl_kv_tier_XXXXXX", d5[] = "/tmp/tl_kv_tier_XXXXXX";
    CHECK(mkdtemp(d1) && mkdtemp(d2) && mkdtemp(d3) && mkdtemp(d4) && mkdtemp(d5), "temporary directories");
    host_tier();
    disk_tier_and_restart(d1);
    save_load_and_refusals(d2);
    bad_options();
    real_model(d3);
    sliding_window(d4);
    real_gemma(d5);
    rm_dir(d4);
    rm_dir(d5);
    rm_dir(d1);
    rm_dir(d2);
    rm_dir(d3);
    unlink(model_path);
    unlink(other_path);
    return test_summary();
}
