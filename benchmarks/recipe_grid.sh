#!/usr/bin/env bash
# Issue 52, part 7: every measurement of the recipe on SmolLM2-135M that benchmarks/results/recipe-vm.json holds, in
# the order they are worth running. Each line skips what the JSON already holds as finished (a bridge only when its
# run is also on this machine, since the lines after it read it), so a rerun after a stop costs only what is missing.
# Run it in the background with the machine to itself:
#     OMP_NUM_THREADS=2 nohup bash benchmarks/recipe_grid.sh > logs/recipe_grid.log 2>&1 &
# Needs the GGUF (bash scripts/get_smollm2.sh) and the prepared data: minimodel prepare
# experiments/recipe_smollm2.yaml --langs en,fr,ru, and again with adapt.vocabulary=extend --langs fr,ru.
# Sections run in the order written: a, c, d, then what is left of b (FOCUS's rows included), e.
# On a 2-core Intel Xeon: about 22 minutes a bridge trained on the LM loss, 70 a distilled one; 10-15 a MiniPost
# step 2 of 500 updates, 25-30 a BL_BASE one (the extended vocabulary costs more: its output layer has 52-54k rows).
# Not in the grid: the lr-1e-3 affine:distill bridge (its row is from another VM; step 2 reads the lr-2e-3 one).
set -euo pipefail
cd "$(dirname "$0")/.."
B=".venv/bin/python benchmarks/bench_recipe.py"
LR2=(--tag lr2e-3 --override bridge.optim.lr=2.0e-3)  # the distilled bridge at lr 2e-3: step 2's mini-model
BRIDGES=random:lm,copy:lm,affine:lm,copy:distill,random:distill

# (a) step 1b at N = 12: every bridge.init with each objective, 1,000 updates of 1,024 English tokens
$B bridge --depth 12 --runs affine:distill "${LR2[@]}"
$B bridge --depth 12 --runs "$BRIDGES"
# how closely each finished bridge follows SmolLM2 (a few minutes a bridge; a bridge the JSON holds is skipped)
$B alignment --depth 12 --runs affine:distill --langs fr,ru "${LR2[@]}"
$B alignment --depth 12 --runs "$BRIDGES" --langs fr,ru
# (c) bridge.langs: the lr-2e-3 distilled bridge trained on English, French and Russian text in SmolLM2's tokens (a
# third each; step 2's held-out text never read), its alignment, and MiniPost's step 2 over it (mean, replaced
# vocabulary). French and Russian in SmolLM2's tokens first (seconds; skipped when prepared):
.venv/bin/minimodel prepare experiments/recipe_smollm2.yaml "bridge.langs=[fr,ru]" --langs fr,ru --only source --no-progress
LANGS=(--tag lr2e-3-langs-fr-ru --override bridge.optim.lr=2.0e-3 --override "bridge.langs=[fr,ru]")
$B bridge --depth 12 --runs affine:distill "${LANGS[@]}"
$B alignment --depth 12 --runs affine:distill --langs fr,ru "${LANGS[@]}"
$B embeddings --depth 12 --systems minipost --inits mean --vocabularies replace --langs fr,ru "${LANGS[@]}"
# (d) spread: the decisive French step-2 rows (MiniPost over the lr-2e-3 distilled bridge, and BL_BASE; mean,
# replaced vocabulary) again with adapt.trainer.seed 2 and 3 (another data order; the same mini-model), rows KEY#sN
for seed in 2 3; do
  $B embeddings --depth 12 --systems minipost --inits mean --vocabularies replace --langs fr "${LR2[@]}" --adapt-seed "$seed"
  $B embeddings --depth 12 --systems bl_base --inits mean --vocabularies replace --langs fr --adapt-seed "$seed"
done
# and MiniPost's French over the bridge that also read French and Russian (section (c)), seeds 2 and 3
for seed in 2 3; do
  $B embeddings --depth 12 --systems minipost --inits mean --vocabularies replace --langs fr "${LANGS[@]}" --adapt-seed "$seed"
done
# (b) step 2: every adapt.init and both vocabularies, 500 updates, over the full model (BL_BASE) and over the
# mini-model (MiniPost over the lr-2e-3 distilled bridge); mean first, the initialisation the recipe uses. Under
# extend, random is the overlap start (every piece SmolLM2 has is kept; the new ones start random under both), so
# extend runs overlap only. FOCUS (adapt.init=focus: fastText vectors of the target pieces trained on step 2's text,
# then FOCUS's mix of SmolLM2's embeddings of the pieces both vocabularies share) last, its step 0 first (minutes;
# skipped when in the JSON). Every BL_BASE row before any MiniPost row: BL_BASE's rows need no bridge, and a new
# machine (no runs/) trains the bridge MiniPost's rows read before the first of them (about 70 minutes).
.venv/bin/python benchmarks/bench_recipe.py init --langs fr,ru --inits focus
step2() {  # system, inits, vocabulary, language
  local over=()
  [ "$1" = minipost ] && over=("${LR2[@]}")
  $B embeddings --depth 12 --systems "$1" --inits "$2" --vocabularies "$3" --langs "$4" "${over[@]}"
}
for system in bl_base minipost; do
  for inits in mean overlap,random; do
    for lang in fr ru; do
      for vocabulary in replace extend; do
        these=$inits
        [ "$vocabulary" = extend ] && [ "$inits" != mean ] && these=overlap
        step2 "$system" "$these" "$vocabulary" "$lang"
      done
    done
  done
  for vocabulary in replace extend; do
    for lang in fr ru; do
      step2 "$system" focus "$vocabulary" "$lang"
    done
  done
done
# MiniPost over the LM-trained bridges (French, mean, replaced vocabulary): what the bridge's objective does to step 2
for bridge in copy:lm affine:lm; do
  $B embeddings --depth 12 --bridge-recipe "$bridge" --systems minipost --inits mean --vocabularies replace --langs fr
done
# (e) the lever left: does a longer bridge over English, French and Russian close the gap to BL_BASE per FLOP? The
# bridge of (c) at 2,000 updates (2M tokens, a third of them English), its alignment and MiniPost's French step 2
# (about 2.5 hours)
LONG=(--updates 2000 --tag lr2e-3-langs-fr-ru-2k --override bridge.optim.lr=2.0e-3 --override "bridge.langs=[fr,ru]")
$B bridge --depth 12 --runs affine:distill "${LONG[@]}"
$B alignment --depth 12 --runs affine:distill --langs fr,ru "${LONG[@]}"
$B embeddings --depth 12 --systems minipost --inits mean --vocabularies replace --langs fr "${LONG[@]}"
# issue 52's targets, read from the JSON (seconds; also after a partial grid: what is measured so far)
$B summary
echo "recipe grid: done"
