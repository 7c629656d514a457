# Copied verbatim from https://github.com/huggingface/trl/blob/f2cd57710ae345ea6428ae95363267fcf38a3dc8/docs/source/peft_integration.md
# (lines 438-447, "QLoRA: Command Line"; commit f2cd57710ae345ea6428ae95363267fcf38a3dc8). Licence: Apache-2.0 (TRL).
python trl/scripts/sft.py \
    --model_name_or_path meta-llama/Llama-2-7b-hf \
    --dataset_name trl-lib/Capybara \
    --load_in_4bit \
    --use_peft \
    --lora_r 32 \
    --lora_alpha 16 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 16 \
    --output_dir Llama-2-7b-QLoRA
