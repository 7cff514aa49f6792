"""``python -m prorl_celery.dev.llm_server --scripted rules.json --port 8000``"""
from prorl_celery.dev.llm_server.cli import llm_serve

if __name__ == "__main__":
    llm_serve()
